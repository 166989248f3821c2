package hfllama

import (
	"fmt"
	"math"
	"sort"
)

// Model holds a llama checkpoint's weights as float32, in Hugging Face's
// layout: every projection is [out, in], row-major.
type Model struct {
	Config Config
	Embed  []float32 // [vocab, hidden]
	Layers []Layer
	Norm   []float32 // [hidden]
	LMHead []float32 // [vocab, hidden]; the embedding when tied
	// RopeInterleaved rotates dimensions (2i, 2i+1) together, as ggml's
	// NORM rope does on a GGUF llama, instead of (i, i+d/2) as Hugging
	// Face's rotate_half does. Only for weights in GGUF's layout.
	RopeInterleaved bool
}

// Layer is one decoder layer.
type Layer struct {
	InputNorm, PostNorm []float32
	Q, K, V, O          []float32
	Gate, Up, Down      []float32
}

// Weight names of a Hugging Face llama checkpoint.
const (
	NameEmbed  = "model.embed_tokens.weight"
	NameNorm   = "model.norm.weight"
	NameLMHead = "lm_head.weight"
)

// LayerName is the name of a layer's weight, for example
// LayerName(0, "self_attn.q_proj").
func LayerName(i int, w string) string { return fmt.Sprintf("model.layers.%d.%s.weight", i, w) }

// Load reads every weight of the checkpoint.
func (ck *Checkpoint) Load() (*Model, error) {
	c := ck.Config
	h, v, d := int64(c.HiddenSize), int64(c.VocabSize), int64(c.HeadDimension())
	q, kv, ff := int64(c.NumAttentionHeads)*d, int64(c.KVHeads())*d, int64(c.IntermediateSize)
	m := &Model{Config: c}
	var err error
	read := func(name string, shape ...int64) []float32 {
		if err != nil {
			return nil
		}
		var w []float32
		w, err = ck.Float32(name, shape...)
		return w
	}
	m.Embed = read(NameEmbed, v, h)
	m.Norm = read(NameNorm, h)
	if ck.Has(NameLMHead) {
		m.LMHead = read(NameLMHead, v, h)
	} else if c.TieWordEmbeddings {
		m.LMHead = m.Embed
	} else {
		return nil, fmt.Errorf("%w: tensor %s is missing and tie_word_embeddings is false", ErrUnsupported, NameLMHead)
	}
	for i := 0; i < c.NumHiddenLayers; i++ {
		m.Layers = append(m.Layers, Layer{
			InputNorm: read(LayerName(i, "input_layernorm"), h),
			PostNorm:  read(LayerName(i, "post_attention_layernorm"), h),
			Q:         read(LayerName(i, "self_attn.q_proj"), q, h),
			K:         read(LayerName(i, "self_attn.k_proj"), kv, h),
			V:         read(LayerName(i, "self_attn.v_proj"), kv, h),
			O:         read(LayerName(i, "self_attn.o_proj"), h, q),
			Gate:      read(LayerName(i, "mlp.gate_proj"), ff, h),
			Up:        read(LayerName(i, "mlp.up_proj"), ff, h),
			Down:      read(LayerName(i, "mlp.down_proj"), h, ff),
		})
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// linear computes y = W x for W [out, in].
func linear(w, x []float32, out int) []float32 {
	in := len(x)
	y := make([]float32, out)
	for o := 0; o < out; o++ {
		row := w[o*in : (o+1)*in]
		var s float64
		for i, xi := range x {
			s += float64(row[i]) * float64(xi)
		}
		y[o] = float32(s)
	}
	return y
}

// rmsNorm is LlamaRMSNorm: x / sqrt(mean(x²) + eps) · weight.
func rmsNorm(x, w []float32, eps float64) []float32 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(float64(v)*inv) * w[i]
	}
	return y
}

// rope applies the rotary embedding the way Hugging Face's llama does:
// q·cos + rotate_half(q)·sin, where rotate_half(x) = cat(-x[d/2:], x[:d/2])
// and the frequencies are repeated over both halves. So dimension i is
// rotated together with dimension i+d/2 (not with i+1, as GGUF's llama
// layout expects: the converter permutes Q and K rows for that).
func rope(x []float32, heads, d, pos int, theta float64, interleaved bool) {
	half := d / 2
	for h := 0; h < heads; h++ {
		v := x[h*d : (h+1)*d]
		for i := 0; i < half; i++ {
			invFreq := 1 / math.Pow(theta, float64(2*i)/float64(d))
			ang := float64(pos) * invFreq
			c, s := math.Cos(ang), math.Sin(ang)
			ia, ib := i, i+half
			if interleaved {
				ia, ib = 2*i, 2*i+1
			}
			a, b := float64(v[ia]), float64(v[ib])
			v[ia] = float32(a*c - b*s)
			v[ib] = float32(b*c + a*s)
		}
	}
}

func silu(x float32) float32 { return x / (1 + float32(math.Exp(-float64(x)))) }

// Logits runs the model over ids and returns the logits of every position.
func (m *Model) Logits(ids []int) [][]float32 {
	c := m.Config
	h, d := c.HiddenSize, c.HeadDimension()
	nq, nkv := c.NumAttentionHeads, c.KVHeads()
	group := nq / nkv
	n := len(ids)
	x := make([][]float32, n)
	for t, id := range ids {
		x[t] = append([]float32(nil), m.Embed[id*h:(id+1)*h]...)
	}
	scale := 1 / math.Sqrt(float64(d))
	for _, l := range m.Layers {
		qs, ks, vs := make([][]float32, n), make([][]float32, n), make([][]float32, n)
		for t := 0; t < n; t++ {
			hn := rmsNorm(x[t], l.InputNorm, c.RMSNormEps)
			qs[t] = linear(l.Q, hn, nq*d)
			ks[t] = linear(l.K, hn, nkv*d)
			vs[t] = linear(l.V, hn, nkv*d)
			rope(qs[t], nq, d, t, c.Theta(), m.RopeInterleaved)
			rope(ks[t], nkv, d, t, c.Theta(), m.RopeInterleaved)
		}
		for t := 0; t < n; t++ {
			att := make([]float32, nq*d)
			for hq := 0; hq < nq; hq++ {
				hk := hq / group
				q := qs[t][hq*d : (hq+1)*d]
				scores := make([]float64, t+1)
				maxS := math.Inf(-1)
				for s := 0; s <= t; s++ {
					k := ks[s][hk*d : (hk+1)*d]
					var dot float64
					for i := range q {
						dot += float64(q[i]) * float64(k[i])
					}
					scores[s] = dot * scale
					maxS = math.Max(maxS, scores[s])
				}
				var sum float64
				for s := range scores {
					scores[s] = math.Exp(scores[s] - maxS)
					sum += scores[s]
				}
				out := att[hq*d : (hq+1)*d]
				for s := range scores {
					w := scores[s] / sum
					vv := vs[s][hk*d : (hk+1)*d]
					for i := range out {
						out[i] += float32(w * float64(vv[i]))
					}
				}
			}
			o := linear(l.O, att, h)
			for i := range x[t] {
				x[t][i] += o[i]
			}
			hn := rmsNorm(x[t], l.PostNorm, c.RMSNormEps)
			g := linear(l.Gate, hn, c.IntermediateSize)
			u := linear(l.Up, hn, c.IntermediateSize)
			for i := range g {
				g[i] = silu(g[i]) * u[i]
			}
			dn := linear(l.Down, g, h)
			for i := range x[t] {
				x[t][i] += dn[i]
			}
		}
	}
	logits := make([][]float32, n)
	for t := 0; t < n; t++ {
		logits[t] = linear(m.LMHead, rmsNorm(x[t], m.Norm, c.RMSNormEps), c.VocabSize)
	}
	return logits
}

// Step is one greedy decoding step.
type Step struct {
	Token int
	// Margin is the logit of the chosen token minus the runner-up's: how
	// much numerical noise the choice withstands.
	Margin float32
}

// Greedy decodes up to n tokens after ids, taking the highest logit each
// time, and stops after a token for which stop returns true.
func (m *Model) Greedy(ids []int, n int, stop func(int) bool) []Step {
	seq := append([]int(nil), ids...)
	var steps []Step
	for len(steps) < n {
		lg := m.Logits(seq)
		last := lg[len(lg)-1]
		order := make([]int, len(last))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return last[order[a]] > last[order[b]] })
		st := Step{Token: order[0], Margin: last[order[0]] - last[order[1]]}
		steps = append(steps, st)
		seq = append(seq, st.Token)
		if stop != nil && stop(st.Token) {
			break
		}
	}
	return steps
}
