"""The workload drivers of bench/nginx_wrk.py, one concern per module, reused by other bench scripts.

* ``console``: progress lines and ``BenchError``, the error that ends a run with a message;
* ``processes``: the child processes (tracked, stopped on exit), ``taskset`` pinning, free ports;
* ``procfs``: CPU and memory of processes and of the machine, from /proc; what counts as noise;
* ``checkout``: this repository, the results folder, the commit a checkout is at;
* ``nginx``: the server, configured and started on 127.0.0.1, its request count;
* ``wrk``: the load, closed loop or at a fixed rate (a Lua scheduler);
* ``agent``: ``otelbpf run`` started and stopped as a user would, its log lines parsed;
* ``span_counting``: the spans delivered, in a JSON file or at the counting OTLP receiver;
* ``pinning``: which CPU runs nginx, the client and the agent;
* ``machine``: the preflight checks, and what the machine is.

bench/ scripts are run as files; bench/ is first on ``sys.path`` then, so ``import wrkbench.x``
works from any of them.
"""
