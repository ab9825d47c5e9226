# C types for processor.py when Cython compiles it (setup.py). The logic lives only in
# processor.py; this file types the export gate's span (a SpanRecord, model.pxd), asked once
# per span, so that its five field reads are C struct reads. Another class there is a
# TypeError, which BatchQueue.add answers as for any span it cannot take: dropped and counted.
from otelbpf.core.model cimport SpanRecord


cpdef bint is_exportable(SpanRecord span) except -1
