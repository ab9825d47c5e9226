// A namespaced class template's member spinning, to check C++ demangling
// (noipa: no ".isra" clone):
// ns::Worker<int>::spin(int).
volatile unsigned long sink;
volatile int stop;
volatile int arg = 1;

namespace ns {
template <typename T> struct Worker {
    __attribute__((noipa)) T spin(T n)
    {
        while (!stop)
            sink += n;
        return static_cast<T>(sink);
    }
};
} // namespace ns

int main() { return ns::Worker<int>().spin(arg) + 1; }
