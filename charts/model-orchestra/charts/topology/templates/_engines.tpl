{{/*
Engine containers. Each template takes a dict with
  root:  the top-level context ($)
  app:   the application name
  spec:  the application values
  name:  the application's full name (mo.appFullname)
  sleep: the application's lifecycle.sleep, when it sleeps
  group: the replica group index (workers only)
and returns one container (a YAML mapping, not a list item).

Every root container serves the OpenAI API on port 8080 ("http"). In a seat
group's pod (seatgroup.yaml), where several engines share the pod, the dict
also carries
  port:             the engine's port (else 8080)
  portName:         its container port's name (else "http")
  engineContainer:  the engine container's name (else "engine")
  sidecarContainer: the sidecar container's name (else "sidecar")
  sidecarPort:      the sidecar's port (else mo.sidecarPort)
  sidecarPortName:  its container port's name (else "sidecar")
  volumeSuffix:     appended to the names of the engine's own volumes
                    (model, tmp, llama-preset)
  seatGroup:        the group's name
*/}}

{{/* The ready-made engine image: runtime.image, else the chart's default. */}}
{{- define "mo.engineImage" -}}
{{- $rt := .spec.runtime -}}
{{- if $rt.image -}}
{{- $rt.image -}}
{{- else -}}
{{- $key := ternary "sim" $rt.engine (eq $rt.engine "simulator") -}}
{{- required (printf "global.images.%s is required for engine %s" $key $rt.engine) (index .root.Values.global.images $key) -}}
{{- end -}}
{{- end -}}

{{/* Security context of third-party engine containers: their images run as
the user they were built for, so only privilege escalation and capabilities
are restricted. */}}
{{- define "mo.engineSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* "true" for the engines that need no root and write only their /tmp
(HOME, OLLAMA_MODELS): Ollama and the simulator. They run as 65532 (the
user of the images this project builds; the upstream Ollama image, the
chart's default, names root but needs none of it) with a read-only root
filesystem. Empty otherwise. */}}
{{- define "mo.nonRootEngine" -}}
{{- if has .spec.runtime.engine (list "ollama" "simulator") }}true{{ end -}}
{{- end -}}

{{/* The user id an engine container runs as, where the chart sets it:
runtime.runAsUser, else 65532 for Ollama and the simulator
(mo.nonRootEngine). Empty for vLLM, llama.cpp and distributed-llama: they
run as the user their image names (the upstream images': root). */}}
{{- define "mo.engineUser" -}}
{{- $rt := .spec.runtime -}}
{{- if hasKey $rt "runAsUser" -}}
{{- int64 $rt.runAsUser -}}
{{- else if include "mo.nonRootEngine" . -}}
65532
{{- end -}}
{{- end -}}

{{/* "true" when the engine reads or writes the node agent's tier
directories: it loads the agent's copies (mo.modelCopies), or it is a
sleeping simulator, which writes its level-1 offload into the namespace's
hot directory and reads the agent's copies on waking. It does so as a
member of the copies' group (global.agent.copyGroup): its primary group,
unless runtime.runAsGroup names another, and a supplementary group of the
pod. Empty otherwise. */}}
{{- define "mo.usesTiers" -}}
{{- if or (include "mo.modelCopies" .) (and .sleep (eq .spec.runtime.engine "simulator")) }}true{{ end -}}
{{- end -}}

{{/* The primary group id of an engine container: runtime.runAsGroup, else
the copies' group for an engine that uses the tiers (mo.usesTiers), else
the engine's user (mo.engineUser). Empty when the user is the image's
too. The kubelet passes the runtime the image's user but not its group,
so without it containerd runs the engine with group 0, root's (containerd
issue 11607). */}}
{{- define "mo.engineGroup" -}}
{{- $rt := .spec.runtime -}}
{{- if hasKey $rt "runAsGroup" -}}
{{- int64 $rt.runAsGroup -}}
{{- else if include "mo.usesTiers" . -}}
{{- .root.Values.global.agent.copyGroup -}}
{{- else -}}
{{- include "mo.engineUser" . -}}
{{- end -}}
{{- end -}}

{{/* The security context of an engine container (and, in a seat group, of
its sidecar, which must run as the same user and group to signal the engine's
processes): the user and group where the chart sets them (mo.engineUser,
mo.engineGroup), not root where that user is not 0, and Ollama and the
simulator with a read-only root filesystem; no capability and no
privilege escalation in every case. */}}
{{- define "mo.engineUserContext" -}}
{{- $user := include "mo.engineUser" . -}}
{{- with $user }}
runAsUser: {{ . }}
{{- end }}
{{- with include "mo.engineGroup" . }}
runAsGroup: {{ . }}
{{- end }}
{{- if and $user (ne $user "0") }}
runAsNonRoot: true
{{- end }}
{{- if include "mo.nonRootEngine" . }}
readOnlyRootFilesystem: true
{{- end }}
{{ include "mo.engineSecurityContext" .root }}
{{- end -}}

{{/* How often the kubelet probes a starting root engine, and for how long:
every second, so that the root turns Ready within about a second of its
engine answering (the kubelet runs the readiness probe as soon as the
startup probe passes, not a readiness period later), for up to an hour of
model loading. */}}
{{- define "mo.engineStartupTiming" -}}
{{- $period := 1 -}}
{{- $loadLimitSeconds := 3600 -}}
periodSeconds: {{ $period }}
failureThreshold: {{ div $loadLimitSeconds $period }}
{{- end -}}

{{/* Probes of a root: the startup probe (timed by mo.engineStartupTiming)
tolerates a model load of up to an hour before liveness takes over. */}}
{{- define "mo.rootProbes" -}}
{{- $engine := .spec.runtime.engine -}}
{{- if eq $engine "ollama" }}
{{- /* Ready once the served model exists: Ollama's GET /v1/models/<name>
answers 404 until `ollama create` made it. An HTTP probe, unlike an exec
of the CLI, costs no process per tick, and the dispatchers can run it
themselves to send a waking root its requests before the kubelet's next
tick (early readiness, docs/lifecycle.md). */}}
startupProbe:
  httpGet:
    path: /v1/models/{{ .served }}
    port: {{ default "http" .portName }}
  {{- include "mo.engineStartupTiming" . | nindent 2 }}
  timeoutSeconds: 5
readinessProbe:
  httpGet:
    path: /v1/models/{{ .served }}
    port: {{ default "http" .portName }}
  periodSeconds: 10
  timeoutSeconds: 5
livenessProbe:
  httpGet:
    path: /api/version
    port: {{ default "http" .portName }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 6
{{- else if eq $engine "dllama" }}
startupProbe:
  tcpSocket:
    port: {{ default "http" .portName }}
  {{- include "mo.engineStartupTiming" . | nindent 2 }}
readinessProbe:
  tcpSocket:
    port: {{ default "http" .portName }}
  periodSeconds: 10
livenessProbe:
  tcpSocket:
    port: {{ default "http" .portName }}
  periodSeconds: 20
  failureThreshold: 6
{{- else }}
startupProbe:
  httpGet:
    path: /health
    port: {{ default "http" .portName }}
  {{- include "mo.engineStartupTiming" . | nindent 2 }}
  timeoutSeconds: 5
readinessProbe:
  httpGet:
    path: /health
    port: {{ default "http" .portName }}
  periodSeconds: 10
  timeoutSeconds: 5
livenessProbe:
  httpGet:
    path: /health
    port: {{ default "http" .portName }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 6
{{- end }}
{{- end -}}

{{/* Warm-up: a postStart hook that waits for the engine to answer and
sends serving.warmupPrompts (env WARMUP_PROMPT_<i>) before Kubernetes
starts probing, so that the root reports ready only once warm. Failed
prompts are logged, not fatal. llama.cpp and vLLM images carry python3;
Ollama uses its CLI, whose answer is cut after its first 64 bytes (the
CLI has no token limit: it would generate until the end of the context;
the others ask for 16 tokens); distributed-llama and the simulator are not
warmed. */}}
{{- define "mo.warmup" -}}
{{- $engine := .spec.runtime.engine -}}
{{- if and .spec.serving.warmupPrompts (has $engine (list "llamacpp" "vllm" "ollama")) }}
lifecycle:
  postStart:
    exec:
      command:
        - /bin/sh
        - -c
        {{- if eq $engine "ollama" }}
        - |
          until ollama show "$SERVED_MODEL_NAME" >/dev/null 2>&1; do sleep 0.5; done
          i=0
          while eval "p=\"\${WARMUP_PROMPT_$i:-}\""; [ -n "$p" ]; do
            ollama run "$SERVED_MODEL_NAME" "$p" 2>/dev/null | head -c 64 | grep -q . || echo "warm-up prompt $i failed"
            i=$((i+1))
          done
        {{- else }}
        - |
          python3 - <<'EOF'
          import json, os, time, urllib.request
          base = "http://127.0.0.1:{{ default 8080 .port }}"
          while True:
              try:
                  urllib.request.urlopen(base + "/health", timeout=5)
                  break
              except Exception:
                  time.sleep(2)
          i = 0
          while "WARMUP_PROMPT_%d" % i in os.environ:
              body = json.dumps({"model": os.environ["SERVED_MODEL_NAME"], "max_tokens": 16,
                                 "messages": [{"role": "user", "content": os.environ["WARMUP_PROMPT_%d" % i]}]}).encode()
              req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
              try:
                  urllib.request.urlopen(req, timeout=600).read()
              except Exception as e:
                  print("warm-up prompt %d failed: %s" % (i, e))
              i += 1
          EOF
        {{- end }}
{{- end }}
{{- end -}}

{{/* Root container of any engine. */}}
{{- define "mo.rootContainer" -}}
{{- $rt := .spec.runtime -}}
{{- $sv := .spec.serving -}}
{{- $m := .spec.model -}}
{{- $served := default .app $sv.servedModelName -}}
{{- $ns := .root.Release.Namespace -}}
{{- $workers := int (default 0 $rt.workers) -}}
{{- $port := int (default 8080 .port) -}}
{{- $vs := default "" .volumeSuffix -}}
name: {{ default "engine" .engineContainer }}
image: {{ include "mo.engineImage" . | quote }}
imagePullPolicy: {{ default "IfNotPresent" $rt.imagePullPolicy }}
{{- if eq $rt.engine "llamacpp" }}
{{- if include "mo.modelCopies" . }}
{{- /* The preset's model path is the sidecar's link to the hottest verified
copy of the model file (mo.modelCopies): the server starts once the link
exists, with the same arguments. */}}
command: ["/bin/sh", "-c", "until [ -e /var/run/model-orchestra/link/model ]; do sleep 0.2; done; exec /app/llama-server \"$@\"", "llama-server"]
{{- else }}
command: ["/app/llama-server"]
{{- end }}
{{- /* llama.cpp's argument parser takes each value as the next argument:
it refuses --flag=value ("invalid argument"). A sleeping application's
server runs in router mode, which the sidecar unloads and loads
(POST /models/unload, /models/load): the model is the one preset of
mo.llamaCppPreset, named after the served model and loaded at start; the
other arguments apply to it. */}}
args:
  - --host
  - 0.0.0.0
  - --port
  - {{ $port | quote }}
  {{- if .sleep }}
  - --models-preset
  - /etc/orchestra/llama/models.ini
  - --models-max
  - "1"
  {{- else }}
  - --model
  - /models/{{ $m.file }}
  - --alias
  - {{ $served | quote }}
  {{- end }}
  - --parallel
  - {{ $sv.maxConcurrency | quote }}
  - --metrics
  {{- with $sv.contextLength }}
  {{- /* llama-server splits the context among its slots. */}}
  - --ctx-size
  - {{ mul . $sv.maxConcurrency | quote }}
  {{- end }}
  {{- if gt (int (default 0 $rt.gpu.count)) 0 }}
  - --n-gpu-layers
  - "999"
  {{- end }}
  {{- if gt $workers 0 }}
  {{- $addrs := list }}
  {{- range $j := until $workers }}
  {{- $addrs = append $addrs (printf "%s-worker-$(POD_INDEX)-%d.%s-workers.%s.svc:50052" $.name $j $.name $ns) }}
  {{- end }}
  - --rpc
  - {{ join "," $addrs | quote }}
  {{- end }}
  {{- range $rt.args }}
  - {{ . | quote }}
  {{- end }}
{{- else if eq $rt.engine "dllama" }}
command: ["dllama-api"]
args:
  - --port
  - {{ $port | quote }}
  - --model
  - /models/{{ $m.file }}
  - --tokenizer
  - /models/{{ $m.tokenizerFile }}
  - --buffer-float-type
  - q80
  - --nthreads
  - {{ .threads | quote }}
  {{- with $sv.contextLength }}
  - --max-seq-len
  - {{ . | quote }}
  {{- end }}
  {{- if gt $workers 0 }}
  - --workers
  {{- range $j := until $workers }}
  - {{ printf "%s-worker-$(POD_INDEX)-%d.%s-workers.%s.svc:9998" $.name $j $.name $ns | quote }}
  {{- end }}
  {{- end }}
  {{- range $rt.args }}
  - {{ . | quote }}
  {{- end }}
{{- else if eq $rt.engine "vllm" }}
{{- /* With model copies (mo.modelCopies) --model is the sidecar's link to the
hottest verified copy of the model directory, which vLLM reads at start and
at a level-2 wake's reload_weights. */}}
{{- $vmodel := printf "--model=/models/%s" (default "" $m.file) | trimSuffix "/" }}
{{- if include "mo.modelCopies" . }}{{ $vmodel = "--model=/var/run/model-orchestra/link/model" }}{{ end }}
{{- $vargs := list "--host=0.0.0.0" (printf "--port=%d" $port) $vmodel (printf "--served-model-name=%s" $served) (printf "--max-num-seqs=%d" (int $sv.maxConcurrency)) }}
{{- with $sv.contextLength }}{{ $vargs = append $vargs (printf "--max-model-len=%d" (int .)) }}{{ end }}
{{- $gpus := int (default 0 $rt.gpu.count) }}
{{- if gt $gpus 1 }}{{ $vargs = append $vargs (printf "--tensor-parallel-size=%d" $gpus) }}{{ end }}
{{- /* The sidecar drives /sleep, /wake_up and /collective_rpc, which vLLM
serves only in development mode (VLLM_SERVER_DEV_MODE=1, below). */}}
{{- if .sleep }}{{ $vargs = append $vargs "--enable-sleep-mode" }}{{ end }}
{{- if gt $workers 0 }}
{{- $vargs = append $vargs (printf "--pipeline-parallel-size=%d" (add1 $workers)) }}
{{- $vargs = append $vargs "--distributed-executor-backend=ray" }}
{{- end }}
{{- range $rt.args }}{{ $vargs = append $vargs . }}{{ end }}
{{- if gt $workers 0 }}
command: ["/bin/sh", "-c"]
args:
  - |
    set -e
    ray start --head --port=6379 --disable-usage-stats
    echo "waiting for {{ add1 $workers }} Ray nodes"
    until [ "$(python3 -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(sum(1 for n in ray.nodes() if n["Alive"]))')" -ge {{ add1 $workers }} ]; do sleep 5; done
    exec python3 -m vllm.entrypoints.openai.api_server "$@"
  - vllm
  {{- range $vargs }}
  - {{ . | quote }}
  {{- end }}
{{- else if include "mo.modelCopies" . }}
{{- /* The server starts once the sidecar placed the link. */}}
command: ["/bin/sh", "-c", "until [ -e /var/run/model-orchestra/link/model ]; do sleep 0.2; done; exec python3 -m vllm.entrypoints.openai.api_server \"$@\"", "vllm"]
args:
  {{- range $vargs }}
  - {{ . | quote }}
  {{- end }}
{{- else }}
command: ["python3", "-m", "vllm.entrypoints.openai.api_server"]
args:
  {{- range $vargs }}
  - {{ . | quote }}
  {{- end }}
{{- end }}
{{- else if eq $rt.engine "ollama" }}
{{- /* Ollama serves only models of its own store (OLLAMA_MODELS, in the
pod's /tmp): once the server answers, the cached GGUF is linked into the
store's blobs under its sha256 (the fetch manifest's, else computed), and
the model is created from that blob under the served name; Ollama lists it
as "<name>:latest" and answers to both. The create is asked of the server's
API (POST /api/create naming the blob's digest: about 10 ms) with the
image's wget where it has one (ours: busybox), so that nothing reads the
whole file again; the `ollama create` CLI, the fallback for images without
wget (upstream's), hashes the whole file client-side first (about 0.65 s
for 248 MiB on 2 shared cores), even though the blob is already there.
Then it is loaded (`ollama run` without a prompt), as the other engines
load theirs before they answer: a sleeping root's sidecar finds it awake, and
the first request does not pay the load. The store is rebuilt at each start (Ollama prunes blobs
no model references when it starts), the cache stays read-only. A TERM
reaches the server, and the container ends with it. With model copies
(mo.modelCopies) the blob links to the sidecar's link instead, which the
sidecar points at the hottest verified copy of the file on the node before
each load (Ollama opens the blob again at each load); the script waits for
the sidecar to place it. */}}
command: ["/bin/sh", "-c"]
args:
  - |
    set -e
    ollama serve &
    server=$!
    trap 'kill -TERM "$server" 2>/dev/null || true' TERM INT
    until ollama list >/dev/null 2>&1; do
      kill -0 "$server" 2>/dev/null || { echo "ollama serve exited before answering"; exit 1; }
      sleep 0.2
    done
    model="/models/$MODEL_FILE"
    digest=$(awk -v f="$MODEL_FILE" '$1 == "\"path\":" { p = ($2 == "\"" f "\",") } p && $1 == "\"sha256\":" { gsub(/[",]/, "", $2); print $2; exit }' /models/.orchestra/manifest.json 2>/dev/null || true)
    [ -n "$digest" ] || digest=$(sha256sum "$model" | cut -d' ' -f1)
    mkdir -p "$OLLAMA_MODELS/blobs"
    if [ -n "${MODEL_LINK:-}" ]; then
      [ -e "$MODEL_LINK" ] || echo "waiting for the sidecar to point $MODEL_LINK at a copy of the model"
      until [ -e "$MODEL_LINK" ]; do sleep 0.2; done
      ln -sf "$MODEL_LINK" "$OLLAMA_MODELS/blobs/sha256-$digest"
    else
      ln -sf "$model" "$OLLAMA_MODELS/blobs/sha256-$digest"
    fi
    if command -v wget >/dev/null 2>&1; then
      wget -q -O /dev/null --header 'Content-Type: application/json' \
        --post-data "{\"model\":\"$SERVED_MODEL_NAME\",\"files\":{\"${MODEL_FILE##*/}\":\"sha256:$digest\"},\"stream\":false}" \
        "http://127.0.0.1:${OLLAMA_HOST##*:}/api/create"
    else
      printf 'FROM %s\n' "$model" > "$HOME/Modelfile"
      ollama create "$SERVED_MODEL_NAME" -f "$HOME/Modelfile"
    fi
    ollama run "$SERVED_MODEL_NAME" </dev/null >/dev/null 2>&1 || echo "loading $SERVED_MODEL_NAME failed: the first request loads it"
    status=0
    wait "$server" || status=$?
    if kill -0 "$server" 2>/dev/null; then wait "$server" || status=$?; fi
    exit "$status"
{{- else if eq $rt.engine "simulator" }}
args:
  - --addr=:{{ $port }}
  - --model={{ $served }}
  - --max-num-seqs={{ $sv.maxConcurrency }}
  {{- with $sv.contextLength }}
  - --max-model-len={{ . }}
  {{- end }}
  {{- if .sleep }}
  {{- /* Level 1 offloads the weights into the hot tier; a level-2 wake
  reads the copy the node agent keeps under the artifact's name
  ("<hot or warm>/<namespace>/<release>-<app>", the ModelCheckpoint's name)
  before the cold source. */}}
  - --enable-sleep-mode
  - --hot-dir=/var/run/model-orchestra/hot
  {{- if include "mo.usesWarmTier" . }}
  - --warm-dir=/var/run/model-orchestra/warm
  {{- end }}
  - --weights-name={{ .name }}
  {{- end }}
  {{- if .seatGroup }}
  {{- /* In a seat group's pod the sidecar restarts an engine that did
  not free its memory in place (POST /orchestra/restart), without
  touching the pod's other engines. */}}
  - --restartable
  {{- if .sleep }}
  {{- /* Swaps sleep the same engines again and again: a sleep reuses the
  level-1 offload the last wake kept instead of writing it again. */}}
  - --keep-offload
  {{- end }}
  {{- /* The group's engines share one device pool, a file on the pod's
  memory-backed emptyDir "device", sized by seatGroups.<group>.deviceMemory
  (unset: no fixed size): an engine that leaks its memory at sleep keeps
  the next one from waking until it is restarted, as on a GPU. */}}
  - --device-file=/var/run/model-orchestra/device/pool
  {{- with (index (default dict .root.Values.global.seatGroups) .seatGroup).deviceMemory }}
  - --device-capacity={{ int64 . }}
  {{- end }}
  {{- end }}
  {{- range $rt.args }}
  - {{ . | quote }}
  {{- end }}
{{- end }}
env:
  - name: POD_INDEX
    valueFrom:
      fieldRef:
        fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
  {{- if eq $rt.engine "ollama" }}
  - name: OLLAMA_HOST
    value: 0.0.0.0:{{ $port }}
  {{- /* ollama serve writes its key pair under $HOME/.ollama. */}}
  - name: HOME
    value: /tmp
  - name: OLLAMA_MODELS
    value: /tmp/ollama/models
  - name: GIN_MODE
    value: release
  - name: OLLAMA_NUM_PARALLEL
    value: {{ $sv.maxConcurrency | quote }}
  {{- /* Without sleep the model stays loaded for good. With it, Ollama's
  own idle unload is the policy's sleep time: the sidecar unloads and preloads
  it (keep_alive 0, then the same keep_alive), and should the dispatcher be
  away Ollama still frees the memory after the same idle time. */}}
  - name: OLLAMA_KEEP_ALIVE
    value: {{ if and .sleep .sleep.after }}{{ .sleep.after | quote }}{{ else }}"-1"{{ end }}
  {{- with $sv.contextLength }}
  - name: OLLAMA_CONTEXT_LENGTH
    value: {{ . | quote }}
  {{- end }}
  - name: MODEL_FILE
    value: {{ $m.file | quote }}
  {{- if include "mo.modelCopies" . }}
  - name: MODEL_LINK
    value: /var/run/model-orchestra/link/model
  {{- end }}
  - name: SERVED_MODEL_NAME
    value: {{ $served | quote }}
  {{- end }}
  {{- range $i, $p := $sv.warmupPrompts }}
  - name: WARMUP_PROMPT_{{ $i }}
    value: {{ $p | quote }}
  {{- end }}
  {{- if and $sv.warmupPrompts (ne $rt.engine "ollama") }}
  - name: SERVED_MODEL_NAME
    value: {{ $served | quote }}
  {{- end }}
  {{- if eq $rt.engine "vllm" }}
  - name: HOME
    value: /tmp
  - name: HF_HUB_OFFLINE
    value: "1"
  {{- if .sleep }}
  - name: VLLM_SERVER_DEV_MODE
    value: "1"
  {{- end }}
  {{- end }}
  {{- with $rt.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: {{ default "http" .portName }}
    containerPort: {{ $port }}
    protocol: TCP
  {{- if and (eq $rt.engine "vllm") (gt $workers 0) }}
  - name: ray
    containerPort: 6379
    protocol: TCP
  {{- end }}
{{- include "mo.rootProbes" (merge (dict "served" $served) .) }}
{{- include "mo.warmup" (merge (dict "served" $served) .) }}
{{- $defaultResources := dict "requests" (dict "cpu" "1" "memory" "2Gi") }}
{{- if eq $rt.engine "simulator" }}
{{- $defaultResources = dict "requests" (dict "cpu" "50m" "memory" "64Mi") "limits" (dict "memory" "256Mi") }}
{{- end }}
resources:
  {{- include "mo.resources" (dict "resources" $rt.resources "default" $defaultResources) | nindent 2 }}
securityContext:
  {{- include "mo.engineUserContext" . | trim | nindent 2 }}
volumeMounts:
  - name: model{{ $vs }}
    mountPath: /models
    readOnly: true
    {{- with include "mo.modelSubPath" . }}
    subPath: {{ . | quote }}
    {{- end }}
  - name: tmp{{ $vs }}
    mountPath: /tmp
  {{- if eq $rt.engine "vllm" }}
  - name: shm
    mountPath: /dev/shm
  {{- end }}
  {{- if and .seatGroup (eq $rt.engine "simulator") }}
  - name: device
    mountPath: /var/run/model-orchestra/device
  {{- end }}
  {{- if and .sleep (eq $rt.engine "simulator") }}
  - name: hot
    mountPath: /var/run/model-orchestra/hot
  {{- if include "mo.usesWarmTier" . }}
  - name: warm
    mountPath: /var/run/model-orchestra/warm
    readOnly: true
  {{- end }}
  {{- end }}
  {{- if and .sleep (eq $rt.engine "llamacpp") }}
  - name: llama-preset{{ $vs }}
    mountPath: /etc/orchestra/llama
    readOnly: true
  {{- end }}
  {{- if include "mo.modelCopies" . }}
  {{- include "mo.modelCopyMounts" . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* "true" when the engine loads the hottest verified copy of its model
on its node (the operator's lifecycle.sleep.modelCopies: Ollama and
llama.cpp, their GGUF, and single-node vLLM, its model directory, also as
members of a seat group, with a fetched model cache of any access mode):
the sidecar points the link /var/run/model-orchestra/link/model at the node
agent's hot copy, else its warm copy, else the model cache. Empty otherwise. */}}
{{- define "mo.modelCopies" -}}
{{- if and .sleep .sleep.modelCopies }}true{{ end -}}
{{- end -}}

{{/* The mounts of the engine and its sidecar with model copies: the
namespace's directories of the node agent's tiers (read-only: the agent
writes them) and the link's directory, an emptyDir the sidecar writes. */}}
{{- define "mo.modelCopyMounts" -}}
- name: hot
  mountPath: /var/run/model-orchestra/hot
  readOnly: true
{{- if include "mo.usesWarmTier" . }}
- name: warm
  mountPath: /var/run/model-orchestra/warm
  readOnly: true
{{- end }}
- name: model-link{{ default "" .volumeSuffix }}
  mountPath: /var/run/model-orchestra/link
{{- end -}}

{{/* "true" when a sleeping application's weights may rest in the warm tier
(node disk): its policy's tiers.warm is not None. Empty otherwise. */}}
{{- define "mo.usesWarmTier" -}}
{{- if and .sleep (ne (default "Disk" (dig "tiers" "warm" "" .sleep)) "None") }}true{{ end -}}
{{- end -}}

{{/* The sidecar of a sleeping application's root (orchestra-agent
--role=sidecar): drives the engine's own sleep and wake API on localhost for
the dispatcher, and is ready only while the engine is Awake, so that a
sleeping root leaves the Service's EndpointSlice. Its sleep, wake and
restart accept only the release's caller token (mo.sidecarCallerTokenVolume),
which only the dispatcher's lifecycle leader holds. Restricted Pod Security
and no other volume, except with model copies (mo.modelCopies): then it
points the engine's link at the hottest verified copy of the model file,
reading the manifest and the node agent's tier directories. */}}
{{- define "mo.sidecarContainer" -}}
{{- $rt := .spec.runtime -}}
{{- $served := default .app .spec.serving.servedModelName -}}
{{- $sidecarPort := int (default (include "mo.sidecarPort" .root) .sidecarPort) -}}
name: {{ default "sidecar" .sidecarContainer }}
image: {{ .root.Values.global.images.agent | quote }}
imagePullPolicy: {{ .root.Values.global.imagePullPolicy }}
args:
  - --role=sidecar
  - --engine={{ $rt.engine }}
  - --engine-url=http://127.0.0.1:{{ default 8080 .port }}
  - --addr=:{{ $sidecarPort }}
  - --sleep-level={{ .sleep.level }}
  {{- if .root.Values.global.agent.enabled }}
  - --caller-token-file={{ include "mo.agentCallerTokenDir" .root }}/token
  {{- end }}
  {{- if has $rt.engine (list "ollama" "llamacpp") }}
  - --model={{ $served }}
  {{- end }}
  {{- if and (eq $rt.engine "ollama") .sleep.after }}
  - --keep-alive={{ .sleep.after }}
  {{- end }}
  {{- if include "mo.modelCopies" . }}
  - --model-link=/var/run/model-orchestra/link/model
  - --model-dir=/models
  - --model-file={{ .spec.model.file }}
  - --copy-hot-dir=/var/run/model-orchestra/hot
  {{- if include "mo.usesWarmTier" . }}
  - --copy-warm-dir=/var/run/model-orchestra/warm
  {{- end }}
  - --copy-name={{ .name }}
  {{- end }}
  {{- if and .seatGroup (ne $rt.engine "simulator") }}
  {{- /* In a seat group's pod (shareProcessNamespace) the sidecar restarts an
  engine that did not free its memory by stopping its container's processes;
  the simulator restarts itself in place (--restartable). */}}
  - --restart-process
  {{- end }}
ports:
  - name: {{ default "sidecar" .sidecarPortName }}
    containerPort: {{ $sidecarPort }}
    protocol: TCP
{{- /* In a seat group's pod the seats of sleeping engines must not make
the pod unready, which would take every engine of the group out of the
Services: there the sidecar is ready while it runs, and the dispatcher's gate
(the application's paused consumer) keeps requests from sleeping engines. */}}
readinessProbe:
  httpGet:
    path: {{ ternary "/healthz" "/readyz" (not (empty .seatGroup)) }}
    port: {{ default "sidecar" .sidecarPortName }}
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 1
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ default "sidecar" .sidecarPortName }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 6
resources:
  requests: {cpu: 10m, memory: 16Mi}
  limits: {memory: 64Mi}
{{- if or .root.Values.global.agent.enabled (include "mo.modelCopies" .) }}
volumeMounts:
  {{- if .root.Values.global.agent.enabled }}
  - name: caller-token
    mountPath: {{ include "mo.agentCallerTokenDir" .root }}
    readOnly: true
  {{- end }}
  {{- if include "mo.modelCopies" . }}
  - name: model{{ default "" .volumeSuffix }}
    mountPath: /models
    readOnly: true
  {{- include "mo.modelCopyMounts" . | nindent 2 }}
  {{- end }}
{{- end }}
{{- $engineUser := include "mo.engineUser" . }}
{{- if and .seatGroup (ne $rt.engine "simulator") }}
{{- /* In a seat group the sidecar signals its engine's processes and reads
their open files, which the kernel allows without any capability only to a
process of the same user and group: the sidecar runs as the engine's user and
group (mo.engineUserContext: 65532 for Ollama, or runtime.runAsUser and
runAsGroup), with every capability dropped like the engine; with model
copies it reads the agent's tiers as a member of the copies' group (the
engine's group, or the pod's supplementary group). Where the
engine runs as its image's user (vLLM and llama.cpp without
runtime.runAsUser: the upstream images' root), the sidecar runs as root,
with the engine's group (root's, or the copies' group with model copies),
without any capability either. */}}
securityContext:
  {{- if $engineUser }}
  {{- include "mo.engineUserContext" (dict "root" .root "spec" .spec "sleep" .sleep) | trim | nindent 2 }}
  {{- if not (include "mo.nonRootEngine" .) }}
  readOnlyRootFilesystem: true
  {{- end }}
  {{- else }}
  runAsUser: 0
  runAsGroup: {{ default 0 (include "mo.engineGroup" (dict "root" .root "spec" .spec "sleep" .sleep)) }}
  runAsNonRoot: false
  readOnlyRootFilesystem: true
  {{- include "mo.engineSecurityContext" .root | nindent 2 }}
  {{- end }}
{{- else }}
{{- /* Else it runs as our image's user; with model copies it reads the
node agent's tier directories and the copies' metadata as a member of their
group (global.agent.copyGroup, a supplementary group of the pod). */}}
securityContext:
  runAsUser: 65532
  runAsGroup: 65532
  {{- include "mo.containerSecurityContext" .root | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The pod volume of the release's caller token (the node agent part's
Secret, mo.agentCallerSecret) for the sidecars: only they mount it in
the pod, so it is readable by any user (0444), whatever user the sidecar runs
as. Rendered where the release has the node agent (global.agent.enabled),
which every sleeping application and seat group has.
volumes: {{- include "mo.sidecarCallerTokenVolume" $ | nindent 2 }} */}}
{{- define "mo.sidecarCallerTokenVolume" -}}
- name: caller-token
  secret:
    secretName: {{ include "mo.agentCallerSecret" . }}
    defaultMode: 0444
{{- end -}}

{{/* llama-server's model preset in router mode: the application's model,
named after the served model and loaded at start.
models.ini: | {{- include "mo.llamaCppPreset" $ctx | nindent 4 }} */}}
{{- define "mo.llamaCppPreset" -}}
version = 1
[{{ default .app .spec.serving.servedModelName }}]
model = {{ if include "mo.modelCopies" . }}/var/run/model-orchestra/link/model{{ else }}/models/{{ .spec.model.file }}{{ end }}
load-on-startup = true
{{- end -}}

{{/* Worker container of a multi-node engine. */}}
{{- define "mo.workerContainer" -}}
{{- $rt := .spec.runtime -}}
{{- $ns := .root.Release.Namespace -}}
name: engine
image: {{ include "mo.engineImage" . | quote }}
imagePullPolicy: {{ default "IfNotPresent" $rt.imagePullPolicy }}
{{- if eq $rt.engine "llamacpp" }}
command: ["/app/rpc-server"]
{{- /* rpc-server binds 127.0.0.1 by default and, like llama-server, takes
each value as the next argument. */}}
args:
  - --host
  - 0.0.0.0
  - --port
  - "50052"
{{- else if eq $rt.engine "dllama" }}
command: ["dllama"]
args:
  - worker
  - --port
  - "9998"
  - --nthreads
  - {{ .threads | quote }}
{{- else if eq $rt.engine "vllm" }}
command: ["/bin/sh", "-c"]
args:
  - exec ray start --block --disable-usage-stats --address={{ printf "%s-%d.%s-root.%s.svc:6379" .name (int .group) .name $ns }}
{{- end }}
{{- with $rt.env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - name: worker
    containerPort: {{ if eq $rt.engine "llamacpp" }}50052{{ else if eq $rt.engine "dllama" }}9998{{ else }}8265{{ end }}
    protocol: TCP
{{- if ne $rt.engine "vllm" }}
startupProbe:
  tcpSocket:
    port: worker
  periodSeconds: 5
  failureThreshold: 120
readinessProbe:
  tcpSocket:
    port: worker
  periodSeconds: 10
livenessProbe:
  tcpSocket:
    port: worker
  periodSeconds: 20
  failureThreshold: 6
{{- else }}
startupProbe:
  exec:
    command: ["ray", "health-check", "--address={{ printf "%s-%d.%s-root.%s.svc:6379" .name (int .group) .name $ns }}"]
  periodSeconds: 10
  timeoutSeconds: 10
  failureThreshold: 360
livenessProbe:
  exec:
    command: ["ray", "health-check", "--address={{ printf "%s-%d.%s-root.%s.svc:6379" .name (int .group) .name $ns }}"]
  periodSeconds: 30
  timeoutSeconds: 10
  failureThreshold: 6
{{- end }}
resources:
  {{- include "mo.resources" (dict "resources" $rt.resources "default" (dict "requests" (dict "cpu" "1" "memory" "2Gi"))) | nindent 2 }}
securityContext:
  {{- include "mo.engineUserContext" (dict "root" .root "spec" .spec) | trim | nindent 2 }}
{{- if eq $rt.engine "vllm" }}
volumeMounts:
  - name: model
    mountPath: /models
    readOnly: true
    {{- with include "mo.modelSubPath" . }}
    subPath: {{ . | quote }}
    {{- end }}
  - name: tmp
    mountPath: /tmp
  - name: shm
    mountPath: /dev/shm
{{- end }}
{{- end -}}

{{/* Init container that holds an engine pod until the fetch Job has
published the whole model (its manifest says complete). */}}
{{- define "mo.waitForModel" -}}
name: wait-for-model{{ default "" .volumeSuffix }}
image: {{ include "mo.engineImage" . | quote }}
imagePullPolicy: {{ default "IfNotPresent" .spec.runtime.imagePullPolicy }}
command: ["/bin/sh", "-c"]
args:
  - |
    until grep -Eq '"complete": *true' /models/.orchestra/manifest.json 2>/dev/null; do
      echo "waiting for the model download into the cache"
      sleep 10
    done
    {{- if .spec.model.convert }}
    until grep -Eq '"complete": *true' /models/.orchestra/convert.json 2>/dev/null &&
      grep -Fq '"output": "{{ .spec.model.file }}"' /models/.orchestra/convert.json && [ -f '/models/{{ .spec.model.file }}' ]; do
      echo "waiting for the conversion to GGUF"
      sleep 10
    done
    {{- end }}
    {{- if .spec.model.sizing }}
    until grep -Eq '"fits": *true' /models/.orchestra/sizing.json 2>/dev/null; do
      echo "waiting for the model's memory check (status.applications.<app>.model.size; ModelReady says why it does not fit)"
      sleep 10
    done
    {{- end }}
resources:
  requests: {cpu: 10m, memory: 16Mi}
  limits: {memory: 64Mi}
securityContext:
  {{- include "mo.engineUserContext" (dict "root" .root "spec" .spec) | trim | nindent 2 }}
volumeMounts:
  - name: model{{ default "" .volumeSuffix }}
    mountPath: /models
    readOnly: true
{{- end -}}

{{/* Resources, or the given defaults when none are set.
{{ include "mo.resources" (dict "resources" $rt.resources "default" $defaults) }} */}}
{{- define "mo.resources" -}}
{{- if .resources -}}
{{- toYaml .resources -}}
{{- else -}}
{{- toYaml .default -}}
{{- end -}}
{{- end -}}
