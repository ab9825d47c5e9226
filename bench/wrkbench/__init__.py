"""nginx under wrk, traced by otelbpf and not: the pieces of bench/nginx_wrk.py.

bench/nginx_wrk.py is the command (its options and the order of the parts); the work is here,
one concern per module, so that other bench scripts reuse the drivers without the report.

The workload drivers:

* ``console``: progress lines and ``BenchError``, the error that ends a run with a message;
* ``processes``: the child processes (tracked, stopped on exit), ``taskset`` pinning, free ports;
* ``procfs``: CPU and memory of processes and of the machine, from /proc; what counts as noise;
* ``checkout``: this repository, the results folder, the commit a checkout is at;
* ``nginx``: the server, configured and started on 127.0.0.1, its request count;
* ``wrk``: the load, closed loop or at a fixed rate (a Lua scheduler);
* ``agent``: ``otelbpf run`` started and stopped as a user would, its log lines parsed;
* ``span_counting``: the spans delivered, in a JSON file or at the counting OTLP receiver;
* ``pinning``: which CPU runs nginx, the client and the agent;
* ``machine``: the preflight checks, and what the machine is;
* ``runs``: measured windows per mode, and the parts (saturation, half load, cost, bpf, loss
  sweeps, start-up).

The report: ``report``, the windows turned into figures, tables, the headline and the JSON file.

bench/ scripts are run as files; bench/ is first on ``sys.path`` then, so ``import wrkbench.x``
works from any of them.
"""
