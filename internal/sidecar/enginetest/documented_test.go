package enginetest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
)

// These tests hold the fakes to what the engines' own sources and docs say
// they answer. The fakes stand in for engines the test suite cannot run
// (vLLM needs a GPU; llama.cpp's router is not built here); the real Ollama
// runs in internal/sidecar's TestOllamaAdapterAgainstRealOllama.

func call(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewBufferString(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func jsonEqual(t *testing.T, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%s: %q is not JSON: %v", what, got, err)
	}
	_ = json.Unmarshal([]byte(want), &w)
	if d := cmp.Diff(w, g); d != "" {
		t.Errorf("%s (-documented +fake):\n%s", what, d)
	}
}

// vLLM's dev-mode endpoints, vllm/entrypoints/openai/api_server.py (the
// revision with `timeout: float | None` in collective_rpc, the v0.11 line;
// the chart pins docker.io/vllm/vllm-openai:v0.11.0):
//
//	@router.post("/sleep")
//	async def sleep(raw_request: Request):
//	    level = raw_request.query_params.get("level", "1")
//	    await engine_client(raw_request).sleep(int(level))
//	    return Response(status_code=200)
//
//	@router.post("/wake_up")
//	async def wake_up(raw_request: Request):
//	    tags = raw_request.query_params.getlist("tags")
//	    if tags == []:
//	        tags = None
//	    await engine_client(raw_request).wake_up(tags)
//	    return Response(status_code=200)
//
//	@router.get("/is_sleeping")
//	async def is_sleeping(raw_request: Request):
//	    is_sleeping = await engine_client(raw_request).is_sleeping()
//	    return JSONResponse(content={"is_sleeping": is_sleeping})
//
//	@router.post("/collective_rpc")
//	    ...
//	    if results is None:
//	        return Response(status_code=200)
//	    response: list[Any] = []
//	    for result in results:
//	        if result is None or isinstance(result, (dict, list)):
//	            response.append(result)
//	    ...
//	    return JSONResponse(content={"results": response})
//
// and vllm/entrypoints/openai/protocol.py:
//
//	class ModelCard(OpenAIBaseModel):
//	    id: str
//	    object: str = "model"
//	    created: int = Field(default_factory=lambda: int(time.time()))
//	    owned_by: str = "vllm"
//	    root: Optional[str] = None
//	    parent: Optional[str] = None
//	    max_model_len: Optional[int] = None
//	    permission: list[ModelPermission] = Field(default_factory=list)
//
//	class ModelList(OpenAIBaseModel):
//	    object: str = "list"
//	    data: list[ModelCard] = Field(default_factory=list)
//
// docs/features/sleep_mode.md: "endpoints like /tokenize, /detokenize,
// and /v1/models continue to work normally" while asleep.
func TestVLLMFakeAnswersAsDocumented(t *testing.T) {
	v := enginetest.NewVLLM()
	defer v.Close()
	u := v.URL()

	if code, body := call(t, "POST", u+"/sleep?level=1", ""); code != 200 || body != "" {
		t.Errorf("POST /sleep?level=1: %d %q; vLLM answers 200 with no body", code, body)
	}
	code, body := call(t, "GET", u+"/is_sleeping", "")
	if code != 200 {
		t.Errorf("GET /is_sleeping: %d", code)
	}
	jsonEqual(t, "GET /is_sleeping while asleep", body, `{"is_sleeping": true}`)

	code, body = call(t, "GET", u+"/v1/models", "")
	if code != 200 {
		t.Errorf("GET /v1/models asleep: %d", code)
	}
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || list.Object != "list" || len(list.Data) != 1 {
		t.Fatalf("GET /v1/models: %q", body)
	}
	var keys []string
	for k := range list.Data[0] {
		keys = append(keys, k)
	}
	want := []string{"created", "id", "max_model_len", "object", "owned_by", "parent", "permission", "root"}
	if d := cmp.Diff(want, keys, cmpSorted); d != "" || list.Data[0]["object"] != "model" || list.Data[0]["owned_by"] != "vllm" {
		t.Errorf("ModelCard fields (-vLLM +fake):\n%s%v", d, list.Data[0])
	}

	if code, body := call(t, "POST", u+"/wake_up?tags=weights", ""); code != 200 || body != "" {
		t.Errorf("POST /wake_up?tags=weights: %d %q; vLLM answers 200 with no body", code, body)
	}
	code, body = call(t, "POST", u+"/collective_rpc", `{"method":"reload_weights"}`)
	if code != 200 {
		t.Errorf("POST /collective_rpc: %d", code)
	}
	jsonEqual(t, "collective_rpc reload_weights (the workers return None)", body, `{"results": [null]}`)
	if code, body := call(t, "POST", u+"/wake_up?tags=kv_cache", ""); code != 200 || body != "" {
		t.Errorf("POST /wake_up?tags=kv_cache: %d %q", code, body)
	}
	_, body = call(t, "GET", u+"/is_sleeping", "")
	jsonEqual(t, "GET /is_sleeping after both wakes", body, `{"is_sleeping": false}`)
}

// llama-server's router mode, ggml-org/llama.cpp tools/server/README.md
// ("Using multiple models", router mode, in llama.cpp since December 2025;
// the revision in the project's code index):
//
//	### GET `/models`: List available models
//	  "data": [{ "id": "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M", "path": "...",
//	    "status": { "value": "loaded", "args": ["llama-server", "-ctx", "4096"] }, ... }]
//	The `status` object can be: {"value": "unloaded"}, {"value": "loading", "args": [...]},
//	{"value": "unloaded", "args": [...], "failed": true, "exit_code": 1},
//	{"value": "loaded", "args": [...]}, {"value": "sleeping", "args": [...]}
//
//	### POST `/models/load`: Load a model
//	Payload: {"model": "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"}   Response: {"success": true}
//
//	### POST `/models/unload`: Unload a model
//	Payload: {"model": "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"}   Response: {"success": true}
//
//	## API errors
//	`llama-server` returns errors in the same format as OAI:
//	{"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
func TestLlamaCPPFakeAnswersAsDocumented(t *testing.T) {
	l := enginetest.NewLlamaCPP("qwen")
	defer l.Close()
	u := l.URL()

	_, body := call(t, "GET", u+"/models", "")
	jsonEqual(t, "GET /models, loaded", body, `{"data":[{"id":"qwen","path":"/models/qwen.gguf","status":{"value":"loaded","args":["llama-server","--model","qwen.gguf"]}}]}`)

	code, body := call(t, "POST", u+"/models/unload", `{"model":"qwen"}`)
	if code != 200 {
		t.Errorf("POST /models/unload: %d", code)
	}
	jsonEqual(t, "POST /models/unload", body, `{"success": true}`)
	_, body = call(t, "GET", u+"/models", "")
	jsonEqual(t, "GET /models, unloaded", body, `{"data":[{"id":"qwen","path":"/models/qwen.gguf","status":{"value":"unloaded"}}]}`)

	_, body = call(t, "POST", u+"/models/load", `{"model":"qwen"}`)
	jsonEqual(t, "POST /models/load", body, `{"success": true}`)

	code, body = call(t, "POST", u+"/models/load", `{"model":"absent"}`)
	var e struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || code >= 200 && code < 300 || e.Error.Code != code || e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("POST /models/load of an unknown model: %d %q; want an OpenAI-format error", code, body)
	}
}

var cmpSorted = cmp.Transformer("sort", func(in []string) []string {
	out := append([]string(nil), in...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
})
