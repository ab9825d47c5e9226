{{/* Names and labels shared by the templates. */}}
{{- define "otelbpf.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "otelbpf.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "otelbpf.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otelbpf.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "otelbpf.labels" -}}
{{ include "otelbpf.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "otelbpf.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "otelbpf.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "otelbpf.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The container's security context for the chosen securityMode. */}}
{{- define "otelbpf.securityContext" -}}
{{- if eq .Values.securityMode "privileged" -}}
privileged: true
{{- else -}}
privileged: false
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
  add: {{ toJson .Values.capabilities }}
{{- end }}
readOnlyRootFilesystem: {{ .Values.readOnlyRootFilesystem }}
{{- end -}}

{{/* `otelbpf run` arguments from the values. */}}
{{- define "otelbpf.args" -}}
- run
{{- if eq .Values.trace.mode "all" }}
- --all
{{- else }}
{{- range .Values.trace.comms }}
- --comm
- {{ . | quote }}
{{- end }}
{{- end }}
{{- if .Values.trace.udp }}
- --udp
{{- end }}
{{- if not .Values.exclude.useDefaults }}
- --no-default-excludes
{{- end }}
{{- range .Values.exclude.comms }}
- --exclude-comm
- {{ . | quote }}
{{- end }}
{{- range .Values.exclude.ports }}
- --exclude-port
- {{ . | quote }}
{{- end }}
- --propagation
- {{ .Values.propagation.mode | quote }}
{{- if ne .Values.propagation.mode "off" }}
- --propagation-cgroup
- /host/cgroup
{{- end }}
- --capture-bytes
- {{ .Values.capture.bytes | quote }}
- --ring-buffer-mb
- {{ .Values.capture.ringBufferMB | quote }}
{{- if .Values.budget.maxCpu }}
- --max-cpu
- {{ .Values.budget.maxCpu | quote }}
{{- end }}
- --nice
- {{ .Values.budget.nice | quote }}
- --health-port
- {{ .Values.healthPort | quote }}
{{- if .Values.metrics.enabled }}
- --prometheus-port
- {{ .Values.healthPort | quote }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
