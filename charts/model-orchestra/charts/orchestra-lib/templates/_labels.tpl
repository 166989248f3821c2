{{/* Labels common to every object.
{{ include "mo.labels" $ }} */}}
{{- define "mo.labels" -}}
app.kubernetes.io/name: modelorchestra
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/part-of: modelorchestra
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
{{- end -}}

{{/* Selector labels of one component.
{{ include "mo.selectorLabels" (dict "root" $ "component" "gateway") }} */}}
{{- define "mo.selectorLabels" -}}
app.kubernetes.io/name: modelorchestra
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector labels of one application's component.
{{ include "mo.appSelectorLabels" (dict "root" $ "app" $name "component" "root") }} */}}
{{- define "mo.appSelectorLabels" -}}
{{ include "mo.selectorLabels" . }}
modelorchestra.io/application: {{ .app | quote }}
{{- end -}}

{{/* Selector labels of one seat group's pods.
{{ include "mo.seatGroupSelectorLabels" (dict "root" $ "group" $g) }} */}}
{{- define "mo.seatGroupSelectorLabels" -}}
{{ include "mo.selectorLabels" (dict "root" .root "component" "seat-group") }}
modelorchestra.io/seat-group: {{ .group | quote }}
{{- end -}}
