/* A call chain main -> outer -> middle -> inner, inner spinning, built with
 * -O2 -fomit-frame-pointer -fno-inline: only DWARF CFI can unwind it.
 * "thread" runs the chain in a second thread instead (ends at clone3).
 * The volatile argument and the "+ 1" after each call keep gcc from
 * specialising or tail-calling the functions, so each one keeps its frame. */
#include <pthread.h>
#include <string.h>

volatile unsigned long sink;
volatile int stop;
volatile int arg = 1;

__attribute__((noinline)) int inner(int n)
{
    while (!stop)
        sink += n;
    return (int)sink;
}

__attribute__((noinline)) int middle(int n) { return inner(n + arg) + 1; }

__attribute__((noinline)) int outer(int n) { return middle(n + arg) + 1; }

static void *thread_main(void *unused)
{
    (void)unused;
    sink = outer(arg);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "thread") == 0) {
        pthread_t t;
        pthread_create(&t, NULL, thread_main, NULL);
        pthread_join(t, NULL);
        return 0;
    }
    return outer(arg) + 1;
}
