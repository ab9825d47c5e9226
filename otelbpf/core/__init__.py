"""The pipeline's core: what an event is, what a span is, and how spans link into traces.

Everything here is below the protocols' semantics and above nothing of the agent's:

* ``events``: what a source hands the pipeline (data, datagrams, calls, process starts);
* ``reorder``: events from different CPUs put back in time order;
* ``connections``: the bounded connection table, one protocol session per connection;
* ``identity`` and ``association``: a span's identity, fixed at its request's start,
  and the linking rules that choose its parent (docs/architecture.md, "Linking");
* ``propagation``: trace context carried in request headers;
* ``model``: the span record every exporter reads;
* ``selfmetrics``: the agent's own counters, which every layer adds its drops to.
"""
