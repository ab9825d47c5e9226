# C types for encode.py when Cython compiles it (setup.py). The logic lives only in
# encode.py; this file types the per-span step's argument (a SpanRecord, an extension
# type: model.pxd), so that its field reads are C struct reads. A record of another
# class is refused at the call (TypeError), which serialize_request already answers
# with the message path, as for any unusual span.
cimport cython as cy
from otelbpf.core.model cimport SpanRecord
from otelbpf.otlp.wire cimport wire_attributes


@cy.locals(parts=list)
cpdef bytes _wire_span(SpanRecord span)

cpdef tuple wire_part(span)
@cy.locals(out=list, by_scope=dict, bodies=list, body=bytes, size=Py_ssize_t, scope_size=Py_ssize_t, length=Py_ssize_t)
cpdef bytes serialize_parts(list parts, resources)
@cy.locals(groups=dict, by_scope=dict, items=list)
cdef dict _group_parts(list parts)
