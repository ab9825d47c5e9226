"""The command line: ``otelbpf run | demo | doctor | replay`` (``main``), and the checks around it.

* ``main``: argument parsing and ``otelbpf run``, which wires sources, pipeline and exporters;
* ``outputs``: the span, metric and profile outputs built from the command line's options;
* ``firstrun``: first-run mistakes said once, with the fix;
* ``demo``: the bundled example services, traced;
* ``doctor``: what this host can and cannot trace, and why;
* ``replay``: a packet capture through the pipeline, in-process.
"""
