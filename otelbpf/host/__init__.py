"""What the agent knows of the host and its processes.

* ``procfs``: /proc read once and parsed without surprises (comm, cmdline, maps, cgroups);
* ``identity``: the host's and a process's identity (host name, container, instance id, language);
* ``resources``: the OpenTelemetry resource of each traced process;
* ``exclusions``: what is never traced (the agent itself, Collectors, the traffic it exports).
"""
