{{/* Velero's namespace. */}}
{{- define "ferry.namespace" -}}
{{- .Values.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The agent's image; holding pods run the same one. */}}
{{- define "ferry.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "ferry.labels" -}}
app.kubernetes.io/name: ferry
app.kubernetes.io/component: agent
{{- end -}}
