{{- /*
Where a woken root pod prefers to run (docs/lifecycle.md, "Parking"): the
dispatcher's lifecycle leader keeps the node label mo.weightsNodeLabel on
the nodes whose node agent holds a copy of the application's weights
(value hot or warm), and the root pods of a sleeping application carry a
static preferred node affinity on it (mo.weightsNodeAffinity). The pod
template never changes when copies move: no drift, no rollout.
*/ -}}

{{- /* mo.weightsNodeLabel (dict "root" $ "app" $app): the node label key,
weights.modelorchestra.io/<namespace>.<release>-<app>, the name part cut
to 52 characters and a hash when it is longer than 63. */ -}}
{{- define "mo.weightsNodeLabel" -}}
{{- $n := printf "%s.%s" .root.Release.Namespace (include "mo.appFullname" .) -}}
{{- if gt (len $n) 63 -}}
{{- $n = printf "%s-%s" ($n | trunc 52 | trimSuffix "-" | trimSuffix ".") ($n | sha256sum | trunc 10) -}}
{{- end -}}
{{- printf "weights.modelorchestra.io/%s" $n -}}
{{- end -}}

{{- /* mo.weightsNodeAffinity (dict "root" $ "app" $app): the preferred
node affinity terms: a node holding a hot copy (weight 100), else a warm
one (50); any node otherwise. */ -}}
{{- define "mo.weightsNodeAffinity" -}}
{{- $key := include "mo.weightsNodeLabel" . -}}
- weight: 100
  preference:
    matchExpressions:
      - key: {{ $key }}
        operator: In
        values: ["hot"]
- weight: 50
  preference:
    matchExpressions:
      - key: {{ $key }}
        operator: In
        values: ["warm"]
{{- end -}}
