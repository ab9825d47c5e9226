/* main -> caller -> nocfi_spin, where nocfi_spin is assembly without any .cfi
 * directive (like MKL's kernels): no unwinder can know its caller from CFI. */
__asm__(".text\n"
        ".globl nocfi_spin\n"
        ".type nocfi_spin, @function\n"
        "nocfi_spin:\n"
        "  sub $24, %rsp\n"
        "1: pause\n"
        "  jmp 1b\n"
        ".size nocfi_spin, .-nocfi_spin\n");

void nocfi_spin(void);
volatile int arg = 1;

__attribute__((noinline)) int caller(int n)
{
    nocfi_spin();
    return n + 1;
}

int main(void) { return caller(arg); }
