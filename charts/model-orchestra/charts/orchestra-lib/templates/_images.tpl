{{/* The pod's imagePullSecrets field from global.imagePullSecrets; nothing
when there are none.
{{- include "mo.imagePullSecrets" $ | nindent 6 }} */}}
{{- define "mo.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ .name | quote }}
{{- end }}
{{- end }}
{{- end -}}
