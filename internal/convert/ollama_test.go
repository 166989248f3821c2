package convert

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/hfllama"
)

// ollamaBinary is bin/ollama of the repository (hack/tools/install.sh
// ollama), or $MO_OLLAMA_BIN.
func ollamaBinary(t *testing.T) string {
	if p := os.Getenv("MO_OLLAMA_BIN"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "bin", "ollama")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no Ollama binary at %s (build it with hack/tools/install.sh ollama, or set MO_OLLAMA_BIN): skipping the comparison with a real engine", p)
	}
	return p
}

type ollama struct {
	url string
	t   *testing.T
}

func startOllama(t *testing.T) *ollama {
	bin := ollamaBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	home := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve")
	cmd.Env = append(os.Environ(), "OLLAMA_HOST="+addr, "OLLAMA_MODELS="+filepath.Join(home, "models"), "HOME="+home,
		"OLLAMA_NUM_PARALLEL=1", "OLLAMA_MAX_LOADED_MODELS=1", "OLLAMA_NOPRUNE=1")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("ollama serve log:\n%s", tail(logs.String(), 6000))
		}
	})
	o := &ollama{url: "http://" + addr, t: t}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(o.url + "/api/version")
		if err == nil {
			_ = resp.Body.Close()
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("ollama serve did not answer in 60 s: %v\n%s", err, tail(logs.String(), 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (o *ollama) post(path string, body io.Reader, out any) {
	o.t.Helper()
	resp, err := http.Post(o.url+path, "application/json", body)
	if err != nil {
		o.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		o.t.Fatalf("POST %s: %s: %s", path, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			o.t.Fatalf("POST %s: %v: %s", path, err, b)
		}
	}
}

// create uploads a GGUF as a blob and creates a model from it, as a
// Modelfile "FROM <file>.gguf" does.
func (o *ollama) create(name, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		o.t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	o.post("/api/blobs/"+digest, bytes.NewReader(b), nil)
	req, _ := json.Marshal(map[string]any{"model": name, "files": map[string]string{filepath.Base(path): digest}, "stream": false})
	o.post("/api/create", bytes.NewReader(req), nil)
}

type generated struct {
	Response   string `json:"response"`
	DoneReason string `json:"done_reason"`
	Logprobs   []struct {
		Token string `json:"token"`
		Bytes []int  `json:"bytes"`
	} `json:"logprobs"`
}

// greedy asks for n tokens at temperature 0 from a raw prompt (no chat
// template), with the log-probabilities that name each generated token.
func (o *ollama) greedy(model, prompt string, n int) generated {
	req, _ := json.Marshal(map[string]any{
		"model": model, "prompt": prompt, "raw": true, "stream": false, "logprobs": true,
		"options": map[string]any{"temperature": 0, "top_k": 1, "seed": 1, "num_predict": n,
			"repeat_penalty": 1, "num_ctx": 256},
	})
	var g generated
	o.post("/api/generate", bytes.NewReader(req), &g)
	return g
}

func secondBest(l []float32, best int) int {
	j := -1
	for i, v := range l {
		if i != best && (j < 0 || v > l[j]) {
			j = i
		}
	}
	return j
}

// minSteps is the shortest greedy continuation (before an end-of-generation
// token) a chosen prompt may have.
const minSteps = 6

// choosePrompt returns the first candidate whose greedy continuation has at
// least minSteps tokens and a margin (top logit minus runner-up) of at least minMargin at every step,
// and that margin.
func choosePrompt(t *testing.T, ref *hfllama.Model, tk *hfllama.Tokenizer, cands []string, n int, minMargin func(ids []int, steps []hfllama.Step) float32) (string, []hfllama.Step) {
	t.Helper()
	for _, p := range cands {
		ids := tk.Encode(p)
		steps := ref.Greedy(ids, n, tk.IsEOG)
		if len(steps) < minSteps {
			continue // too short to show much: it ends early
		}
		worst := float32(math.Inf(1))
		for _, s := range steps {
			worst = min(worst, s.Margin)
		}
		need := minMargin(ids, steps)
		if worst >= need {
			t.Logf("prompt %q: smallest margin %.3f, needed %.3f", p, worst, need)
			return p, steps
		}
	}
	t.Fatalf("none of the %d candidate prompts has well separated greedy choices", len(cands))
	return "", nil
}

// The proof that the conversion keeps the checkpoint's meaning: Ollama
// (its llama.cpp runner), loading the converted GGUF, generates at
// temperature 0 exactly the tokens the Go reference forward pass (Hugging
// Face's llama semantics, on the safetensors weights) chooses greedily: at
// F16, and at Q8_0 for a prompt whose choices are well separated.
func TestOllamaGeneratesTheReferenceTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real ollama serve: skipped with -short")
	}
	o := startOllama(t)
	// candidates: a few fixed prompts, then every window of four words of
	// a fixed text, in order
	cands := []string{"The quick brown fox", "Hello world! It's 2026 and", "Tokens are pieces of text"}
	words := strings.Fields("The model orchestra serves language models on Kubernetes. A model is fetched once into a cache, " +
		"converted when the engine needs another format, and served by engines that share the work. Tokens are pieces of text; " +
		"the tokenizer splits the text into words and merges frequent pairs of bytes into longer tokens. It's a test of the " +
		"conversion of weights from safetensors to GGUF, at sixteen bits and at eight bits.")
	for i := 0; i+4 <= len(words); i++ {
		cands = append(cands, strings.Join(words[i:i+4], " "))
	}
	for _, tied := range []bool{false, true} {
		dir := tiny(t, hfllama.TinyOptions{Seed: 2026, Tied: tied})
		ck, err := hfllama.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := ck.Load()
		_ = ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		tk, err := hfllama.ReadTokenizer(dir)
		if err != nil {
			t.Fatal(err)
		}
		eog := map[int]bool{}
		for _, s := range []string{"<|end_of_text|>", "<|eot_id|>"} {
			eog[tk.Vocab[s]] = true
		}
		for _, typ := range []Type{F16, Q8_0, Q4_0} {
			res, err := Run(context.Background(), Options{Dir: dir, Type: typ})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, res.Output)
			quant := ggufModel(t, path, ref.Config)
			// How the prompt is chosen: the first candidate (a fixed list)
			// whose greedy choices are well separated, so that rounding the
			// engine does and the Go pass does not model cannot flip one.
			// (1) The Go pass on the GGUF's own dequantized weights must
			// choose the same tokens as the reference; (2) at every step the
			// reference's margin (top logit minus runner-up) must exceed 3×
			// the largest change of that margin the converted weights cause,
			// and a floor for the engine's rounding of activations, which
			// the Go pass does not do: 1% of the logits' rms at F16 (ggml
			// rounds activations to float16, 2^-11 relative), 5% at Q8_0
			// (ggml quantizes activations to 8-bit blocks for the Q8_0 dot
			// products, 2^-8 relative).
			floor := map[Type]float64{F16: 0.01, Q8_0: 0.05, Q4_0: 0.05}[typ]
			n := map[Type]int{F16: 16, Q8_0: 12, Q4_0: 12}[typ]
			// Q4_0 changes the model too much to match the checkpoint; its
			// reference is the Go pass on the file's own dequantized
			// weights, which checks the block layout (scale, nibble order)
			// against the engine's reading of it.
			want := ref
			if typ == Q4_0 {
				want = quant
			}
			prompt, steps := choosePrompt(t, want, tk, cands, n, func(ids []int, steps []hfllama.Step) float32 {
				seq := append([]int(nil), ids...)
				for _, s := range steps {
					seq = append(seq, s.Token)
				}
				want, got := want.Logits(seq), quant.Logits(seq)
				qsteps := quant.Greedy(ids, len(steps), tk.IsEOG)
				var change float64
				for i, s := range steps {
					if i >= len(qsteps) || qsteps[i].Token != s.Token {
						return float32(math.Inf(1))
					}
					at := len(ids) + i - 1
					runnerUp := secondBest(want[at], s.Token)
					dRef := float64(want[at][s.Token] - want[at][runnerUp])
					dGot := float64(got[at][s.Token] - got[at][runnerUp])
					change = math.Max(change, math.Abs(dRef-dGot))
				}
				return float32(math.Max(3*change, floor*rms(want)))
			})
			var wantIDs []int
			for _, s := range steps {
				wantIDs = append(wantIDs, s.Token)
			}
			name := fmt.Sprintf("tiny-%s-tied%v", typ, tied)
			o.create(name, path)
			g := o.greedy(name, prompt, n)
			t.Logf("tied %v %s: prompt %q: reference %v %q; ollama %q (%s, %d tokens)", tied, typ, prompt, wantIDs, tk.Decode(wantIDs), g.Response, g.DoneReason, len(g.Logprobs))
			if len(g.Logprobs) == 0 {
				t.Fatalf("tied %v %s: ollama returned no tokens", tied, typ)
			}
			for i, lp := range g.Logprobs {
				if i >= len(wantIDs) {
					t.Fatalf("tied %v %s: ollama generated more tokens (%d) than the reference (%d)", tied, typ, len(g.Logprobs), len(wantIDs))
				}
				got := make([]byte, len(lp.Bytes))
				for j, b := range lp.Bytes {
					got[j] = byte(b)
				}
				want := tk.TokenBytes(wantIDs[i])
				if !bytes.Equal(got, want) && (wantIDs[i] < 256+len(tk.Merges) || len(got) != 0) {
					t.Fatalf("tied %v %s: token %d: ollama %q, reference %q (id %d)", tied, typ, i, got, want, wantIDs[i])
				}
			}
			if k := len(g.Logprobs); k < len(wantIDs) && !eog[wantIDs[k]] {
				t.Fatalf("tied %v %s: ollama stopped after %d tokens (%s), the reference goes on with %d", tied, typ, k, g.DoneReason, wantIDs[k])
			}
			if typ != F16 || tied {
				continue
			}
			// The same file without the Q/K permutation (Hugging Face's row
			// order in a GGUF) makes Ollama answer differently: the
			// comparison above sees a wrong rotary layout.
			bad := tiny(t, hfllama.TinyOptions{Seed: 2026, Tied: tied})
			skipPermutationForTest = true
			badRes, err := Run(context.Background(), Options{Dir: bad, Type: typ, Name: "unpermuted"})
			skipPermutationForTest = false
			if err != nil {
				t.Fatal(err)
			}
			o.create("tiny-unpermuted", filepath.Join(bad, badRes.Output))
			ug := o.greedy("tiny-unpermuted", prompt, n)
			t.Logf("unpermuted Q/K: ollama %q", ug.Response)
			if ug.Response == g.Response {
				t.Errorf("without the Q/K permutation Ollama still answers %q: the comparison cannot see a wrong permutation", ug.Response)
			}
		}
	}
}
