# C types for histograms.py when Cython compiles it (setup.py). The logic lives only in
# histograms.py; this file types the series-key helper that SpanMetrics.record calls once
# per measured span, so that its lookups are C dict lookups (a C call, not a Python one).

cpdef tuple _dict_key(dict attributes, tuple keys)
