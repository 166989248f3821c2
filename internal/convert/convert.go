// Package convert turns a Hugging Face llama-family checkpoint in a model
// cache (config.json, *.safetensors shards, tokenizer.json and
// tokenizer_config.json) into one GGUF file at F16, Q8_0 or Q4_0, the
// format llama.cpp and Ollama load.
//
// The output is written beside the checkpoint. Like the fetcher's
// downloads it is built under .orchestra/partial, fsynced and verified
// before it is renamed to its final name, so an engine never sees half a
// file; a journal of the bytes known durable and the sha256 state at that
// point lets a killed conversion resume; .orchestra/convert.json records
// the inputs' digests, the weight type, and the output's size and sha256,
// so a second run with the same inputs ends at once.
package convert

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/model-orchestra/operator/internal/gguf"
	"github.com/model-orchestra/operator/internal/hfllama"
)

// ErrUnsupported marks a checkpoint that cannot be converted; the message
// names what is missing or unsupported.
var ErrUnsupported = hfllama.ErrUnsupported

// Options of one conversion.
type Options struct {
	// Dir is the model cache holding the checkpoint.
	Dir string
	// Type is the weight type of the output.
	Type Type
	// Output is the file name, relative to Dir (default OutputName(Type)).
	Output string
	// Name is general.name (default the directory's base name).
	Name string
	// Progress, when set, is called as bytes are written.
	Progress func(done, total int64)
	// JournalEvery is how many bytes are written between durable
	// checkpoints of a resumable run (default 64 MiB).
	JournalEvery int64
	Log          *slog.Logger
}

// OutputName is the default file name of a conversion to t.
func OutputName(t Type) string { return "model-" + string(t) + ".gguf" }

// Manifest is .orchestra/convert.json.
type Manifest struct {
	Version  int    `json:"version"`
	Complete bool   `json:"complete"`
	Type     Type   `json:"type"`
	Output   string `json:"output"`
	// Inputs is the sha256 over the checkpoint files' names, sizes and
	// digests; a different checkpoint means a new conversion.
	Inputs    string    `json:"inputs"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
	Converter string    `json:"converter"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Converter names this implementation in the manifest; a change of the
// output bytes bumps it.
const Converter = "orchestra-convert/1"

// ManifestPath is where a cache records its conversion.
func ManifestPath(dir string) string { return filepath.Join(dir, ".orchestra", "convert.json") }

// Result of a conversion.
type Result struct {
	Manifest
	// Cached is true when the output was already complete.
	Cached bool
}

// Check reads the checkpoint's configuration and tokenizer and maps its
// tensors, reporting what makes it unconvertible without writing anything.
func Check(dir string, t Type) error {
	ck, err := hfllama.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = ck.Close() }()
	tk, err := hfllama.ReadTokenizer(dir)
	if err != nil {
		return err
	}
	if _, err := plan(ck, t); err != nil {
		return err
	}
	_, err = metadata(ck, tk, t, "")
	return err
}

// Run converts, resumes an interrupted conversion, or finds it done.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Output == "" {
		o.Output = OutputName(o.Type)
	}
	if o.Name == "" {
		o.Name = filepath.Base(o.Dir)
	}
	if o.JournalEvery <= 0 {
		o.JournalEvery = 64 << 20
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if filepath.IsAbs(o.Output) || !filepath.IsLocal(o.Output) {
		return Result{}, fmt.Errorf("output %q must be a relative path inside the cache", o.Output)
	}
	inputs, err := inputsDigest(o.Dir)
	if err != nil {
		return Result{}, err
	}
	final := filepath.Join(o.Dir, o.Output)
	if m, err := readManifest(o.Dir); err == nil && m.Complete && m.Inputs == inputs && m.Type == o.Type && m.Output == o.Output && m.Converter == Converter {
		if st, err := os.Stat(final); err == nil && st.Size() == m.Size {
			return Result{Manifest: m, Cached: true}, nil
		}
	}
	// whatever the manifest described is stale now: no engine may load it
	if m, err := readManifest(o.Dir); err == nil {
		m.Complete = false
		if err := writeManifest(o.Dir, m); err != nil {
			return Result{}, err
		}
		if m.Output != "" && filepath.IsLocal(m.Output) {
			_ = os.Remove(filepath.Join(o.Dir, m.Output))
		}
	}

	ck, err := hfllama.Open(o.Dir)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = ck.Close() }()
	tk, err := hfllama.ReadTokenizer(o.Dir)
	if err != nil {
		return Result{}, err
	}
	ps, err := plan(ck, o.Type)
	if err != nil {
		return Result{}, err
	}
	kv, err := metadata(ck, tk, o.Type, o.Name)
	if err != nil {
		return Result{}, err
	}

	// layout: where the data section starts and where each tensor ends
	file := gguf.File{Metadata: kv}
	for _, p := range ps {
		file.Tensors = append(file.Tensors, gguf.Tensor{Name: p.name, Shape: p.shape(), Type: p.typ})
	}
	_, ends, total, err := layout(file)
	if err != nil {
		return Result{}, err
	}

	partDir := filepath.Join(o.Dir, ".orchestra", "partial")
	if err := os.MkdirAll(partDir, 0o755); err != nil {
		return Result{}, err
	}
	part := filepath.Join(partDir, filepath.Base(o.Output)+".convert.part")
	jpath := part[:len(part)-len(".part")] + ".journal"
	w, err := openPart(part, jpath, journal{Inputs: inputs, Type: o.Type, Converter: Converter, Total: total}, o)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = w.f.Close() }()
	if w.resumeAt > 0 {
		o.Log.Info("resuming conversion", "output", o.Output, "bytes", w.resumeAt, "total", total)
	}
	for i, p := range ps {
		end := ends[i]
		file.Tensors[i].Data = tensorData(ck, p, func() bool { return end <= w.resumeAt })
	}
	w.ctx = ctx
	if _, err := gguf.Encode(w, file); err != nil {
		if ctx.Err() != nil {
			_ = w.checkpoint()
			return Result{}, fmt.Errorf("conversion interrupted (running again resumes it): %w", ctx.Err())
		}
		return Result{}, fmt.Errorf("writing %s: %w", o.Output, err)
	}
	if err := w.f.Sync(); err != nil {
		return Result{}, err
	}
	sum := hex.EncodeToString(w.h.Sum(nil))
	if w.n != total {
		return Result{}, fmt.Errorf("wrote %d bytes, the layout says %d", w.n, total)
	}
	// verify what is on disk before anyone may load it: the bytes hash to
	// what was written and the header parses with the expected tensors
	if err := verify(part, total, sum, len(ps)); err != nil {
		_ = os.Remove(part)
		_ = os.Remove(jpath)
		return Result{}, fmt.Errorf("verifying %s: %w", o.Output, err)
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return Result{}, err
	}
	if err := os.Rename(part, final); err != nil {
		return Result{}, err
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return Result{}, err
	}
	_ = os.Remove(jpath)
	m := Manifest{Version: 1, Complete: true, Type: o.Type, Output: o.Output, Inputs: inputs, Size: total, SHA256: sum, Converter: Converter, UpdatedAt: time.Now().UTC()}
	if err := writeManifest(o.Dir, m); err != nil {
		return Result{}, err
	}
	if o.Progress != nil {
		o.Progress(total, total)
	}
	return Result{Manifest: m}, nil
}

var errLayout = errors.New("layout probe")

// layout computes where the tensor data starts and where each tensor ends
// by encoding the header alone (the first tensor stops the encoder).
func layout(f gguf.File) (dataStart int64, ends []int64, total int64, err error) {
	probe := f
	probe.Tensors = append([]gguf.Tensor(nil), f.Tensors...)
	for i := range probe.Tensors {
		probe.Tensors[i].Data = func(io.Writer) error { return errLayout }
	}
	n, err := gguf.Encode(io.Discard, probe)
	if !errors.Is(err, errLayout) {
		return 0, nil, 0, fmt.Errorf("encoding the GGUF header: %w", err)
	}
	align := int64(gguf.DefaultAlignment)
	off := n
	for i, t := range f.Tensors {
		size, err := t.Type.DataSize(t.Shape)
		if err != nil {
			return 0, nil, 0, err
		}
		off += int64(size)
		ends = append(ends, off)
		if i < len(f.Tensors)-1 {
			off = (off + align - 1) / align * align
		}
	}
	return n, ends, off, nil
}

// journal is the resume state of a partial output.
type journal struct {
	Inputs    string `json:"inputs"`
	Type      Type   `json:"type"`
	Converter string `json:"converter"`
	Total     int64  `json:"total"`
	// Durable bytes of the partial file and the sha256 state after them.
	Durable   int64  `json:"durable"`
	HashState []byte `json:"hashState"`
}

// partWriter writes the encoder's stream into the partial file, dropping
// the bytes an earlier run made durable, hashing the rest, and
// checkpointing durable progress into the journal.
type partWriter struct {
	ctx      context.Context
	f        *os.File
	jpath    string
	j        journal
	h        hash.Hash
	n        int64 // stream position
	resumeAt int64
	lastJ    int64
	o        Options
}

func openPart(part, jpath string, want journal, o Options) (*partWriter, error) {
	w := &partWriter{jpath: jpath, j: want, h: sha256.New(), o: o}
	var j journal
	if b, err := os.ReadFile(jpath); err == nil && json.Unmarshal(b, &j) == nil &&
		j.Inputs == want.Inputs && j.Type == want.Type && j.Converter == want.Converter && j.Total == want.Total && j.Durable > 0 {
		if st, err := os.Stat(part); err == nil && st.Size() >= j.Durable {
			if err := w.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(j.HashState); err == nil {
				w.resumeAt = j.Durable
				w.j = j
			} else {
				w.h = sha256.New()
			}
		}
	}
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(w.resumeAt); err != nil {
		_ = f.Close()
		return nil, err
	}
	if _, err := f.Seek(w.resumeAt, io.SeekStart); err != nil {
		_ = f.Close()
		return nil, err
	}
	w.f = f
	w.lastJ = w.resumeAt
	if w.resumeAt == 0 {
		_ = os.Remove(jpath)
	}
	return w, nil
}

func (w *partWriter) Write(p []byte) (int, error) {
	if w.ctx != nil && w.ctx.Err() != nil {
		return 0, w.ctx.Err()
	}
	n := len(p)
	if skip := w.resumeAt - w.n; skip > 0 {
		if int64(len(p)) <= skip {
			w.n += int64(len(p))
			return n, nil
		}
		p = p[skip:]
		w.n += skip
	}
	if _, err := w.f.Write(p); err != nil {
		return 0, err
	}
	w.h.Write(p)
	w.n += int64(len(p))
	if w.o.Progress != nil {
		w.o.Progress(w.n, w.j.Total)
	}
	if w.n-w.lastJ >= w.o.JournalEvery {
		if err := w.checkpoint(); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// checkpoint makes the written bytes durable and records them.
func (w *partWriter) checkpoint() error {
	if w.n <= w.resumeAt || w.n == w.lastJ {
		return nil
	}
	if err := w.f.Sync(); err != nil {
		return err
	}
	st, err := w.h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return err
	}
	w.j.Durable, w.j.HashState = w.n, st
	b, _ := json.Marshal(w.j)
	if err := writeFileAtomic(w.jpath, b); err != nil {
		return err
	}
	w.lastJ = w.n
	return nil
}

// inputsDigest identifies the checkpoint: the fetch manifest's digests of
// the files conversion reads when it has them, else their sha256.
func inputsDigest(dir string) (string, error) {
	known := map[string]string{}
	if b, err := os.ReadFile(filepath.Join(dir, ".orchestra", "manifest.json")); err == nil {
		var fm struct {
			Files []struct {
				Path   string `json:"path"`
				Size   int64  `json:"size"`
				SHA256 string `json:"sha256"`
			} `json:"files"`
		}
		if json.Unmarshal(b, &fm) == nil {
			for _, f := range fm.Files {
				if f.SHA256 != "" {
					known[f.Path] = fmt.Sprintf("%d:%s", f.Size, f.SHA256)
				}
			}
		}
	}
	names := []string{"config.json", "tokenizer.json", "tokenizer_config.json"}
	shards, err := hfllama.ShardFiles(dir)
	if err != nil {
		return "", err
	}
	for _, s := range shards {
		names = append(names, filepath.Base(s))
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		id, ok := known[n]
		if !ok {
			f, err := os.Open(filepath.Join(dir, n))
			if errors.Is(err, os.ErrNotExist) {
				id = "missing"
			} else if err != nil {
				return "", err
			} else {
				fh := sha256.New()
				sz, err := io.Copy(fh, f)
				_ = f.Close()
				if err != nil {
					return "", err
				}
				id = fmt.Sprintf("%d:%x", sz, fh.Sum(nil))
			}
		}
		fmt.Fprintf(h, "%s\x00%s\n", n, id)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func readManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(ManifestPath(dir))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

func writeManifest(dir string, m Manifest) error {
	m.UpdatedAt = time.Now().UTC()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(ManifestPath(dir)), 0o755); err != nil {
		return err
	}
	return writeFileAtomic(ManifestPath(dir), append(b, '\n'))
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}
