/* Sleeps, then dlopen()s the library named by argv[1] and spins in its
 * plugin_spin: the unwinder must re-read the mappings to name it. */
#include <dlfcn.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    usleep(1000 * 1000);
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL)
        return 1;
    void (*spin)(void) = (void (*)(void))dlsym(lib, "plugin_spin");
    spin();
    return 0;
}
