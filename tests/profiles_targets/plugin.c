/* A shared library loaded after the unwinder first saw its process. */
volatile unsigned long plugin_sink;

__attribute__((noipa)) void plugin_spin(void)
{
    for (;;)
        plugin_sink++;
}
