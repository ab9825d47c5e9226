"""The agent at run time: the loop that drains a source into the pipeline, and what keeps it healthy.

* ``agent``: the drain loop, its sleeps, and the live pipeline it feeds;
* ``budget``: the CPU budget (``--max-cpu``), kept by tracing fewer connections;
* ``gctune``: garbage collection set for the agent's steady state;
* ``health``: the health and self-metrics port for Kubernetes and Prometheus.
"""
