{{/* The image reference. */}}
{{- define "kiln.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | toString }}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "kiln.labels" -}}
app.kubernetes.io/part-of: kiln
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The webhook's name (its Deployment, Service, Secret and configurations). */}}
{{- define "kiln.webhook" -}}
{{ .Release.Name }}-webhook
{{- end -}}

{{/* The server's name. */}}
{{- define "kiln.server" -}}
{{ .Release.Name }}-server
{{- end -}}
