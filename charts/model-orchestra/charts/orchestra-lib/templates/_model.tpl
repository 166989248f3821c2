{{/* The claim holding an application's model: the claim of a pvc:// source,
the cache's existingClaim, or the cache the model-cache part creates.
{{ include "mo.modelClaim" (dict "root" $ "app" $name "spec" $spec) }} */}}
{{- define "mo.modelClaim" -}}
{{- $m := .spec.model -}}
{{- if hasPrefix "pvc://" $m.source -}}
{{- (splitList "/" (trimPrefix "pvc://" $m.source)) | first -}}
{{- else if and $m.cache $m.cache.existingClaim -}}
{{- $m.cache.existingClaim -}}
{{- else -}}
{{- printf "%s-model" (include "mo.appFullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The model's path inside that claim: what follows the claim in a pvc://
source, else nothing.
{{ include "mo.modelSubPath" (dict "root" $ "app" $name "spec" $spec) }} */}}
{{- define "mo.modelSubPath" -}}
{{- $m := .spec.model -}}
{{- if hasPrefix "pvc://" $m.source -}}
{{- rest (splitList "/" (trimPrefix "pvc://" $m.source)) | join "/" -}}
{{- end -}}
{{- end -}}
