// Command bench-fetch measures orchestra-fetch against curl on the same
// bytes: a deterministic synthetic repository (generated on the fly, no
// disk for the source) served from loopback by the fake hub. It prints a
// table and writes it into docs/benchmarks.md between the
// <!-- bench-fetch:start --> and <!-- bench-fetch:end --> markers.
//
//	go run ./hack/bench-fetch --size 2GiB
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
)

const (
	startMarker = "<!-- bench-fetch:start -->"
	endMarker   = "<!-- bench-fetch:end -->"
)

type result struct {
	name  string
	wall  time.Duration
	cpu   time.Duration
	bytes int64
}

func (r result) mibps() float64 { return float64(r.bytes) / (1 << 20) / r.wall.Seconds() }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-fetch:", err)
		os.Exit(1)
	}
}

func run() error {
	sizeFlag := flag.String("size", "2GiB", "total repository size")
	files := flag.Int("files", 2, "number of files the size is split into")
	concurrency := flag.Int("concurrency", 8, "orchestra-fetch --concurrency")
	chunk := flag.String("chunk-size", "64MiB", "orchestra-fetch --chunk-size")
	fetchBin := flag.String("fetch-bin", "", "orchestra-fetch binary (built into the work dir when empty)")
	curl := flag.String("curl", "/usr/bin/curl", "curl binary")
	work := flag.String("work", "", "scratch directory (default: a new one in $TMPDIR)")
	docs := flag.String("docs", "docs/benchmarks.md", "markdown file to update between the markers (empty: print only)")
	flag.Parse()

	size, err := fetch.ParseBytes(*sizeFlag)
	if err != nil {
		return err
	}
	if *work == "" {
		if *work, err = os.MkdirTemp("", "bench-fetch-"); err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(*work) }() // best-effort cleanup of a temp dir
	}
	if *fetchBin == "" {
		*fetchBin = filepath.Join(*work, "orchestra-fetch")
		fmt.Fprintln(os.Stderr, "building orchestra-fetch ...")
		cmd := exec.Command("go", "build", "-o", *fetchBin, "./cmd/orchestra-fetch")
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building orchestra-fetch: %w", err)
		}
	}

	// The repository: files generated on the fly, listed as LFS with sha256.
	repo := &hubtest.Repo{ID: "bench/synthetic"}
	per := size / int64(*files)
	for i := 0; i < *files; i++ {
		n := per
		if i == *files-1 {
			n = size - per*int64(*files-1)
		}
		repo.Files = append(repo.Files, hubtest.File{
			Path: fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, *files), Content: fetchtest.Synthetic(n, uint64(i+1)), LFS: true,
		})
	}
	fmt.Fprintf(os.Stderr, "hashing the %s synthetic repository for the listing ...\n", fetch.FormatBytes(size))
	hashStart := time.Now()
	hub := &hubtest.Server{}
	hub.AddRepo(repo)
	hashTime := time.Since(hashStart)
	hub.SetCDNBase("")
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()

	var results []result
	measure := func(name, dir string, cmd *exec.Cmd) error {
		fmt.Fprintf(os.Stderr, "running %s ...\n", name)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		err := cmd.Run()
		wall := time.Since(start)
		if err != nil {
			return fmt.Errorf("%s: %w\n%s", name, err, tail(stderr.String(), 2000))
		}
		got, err := dirBytes(dir)
		if err != nil {
			return err
		}
		if got != size {
			return fmt.Errorf("%s wrote %d bytes, want %d", name, got, size)
		}
		results = append(results, result{name: name, wall: wall, bytes: size,
			cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()})
		return os.RemoveAll(dir) // never keep two copies on disk
	}

	// curl: one connection per file, sequentially, following the CDN redirect.
	curlDir := filepath.Join(*work, "curl")
	if err := os.MkdirAll(curlDir, 0o755); err != nil {
		return err
	}
	args := []string{"-sS", "-f", "-L"}
	for _, f := range repo.Files {
		args = append(args, "-o", filepath.Join(curlDir, f.Path), srv.URL+"/bench/synthetic/resolve/main/"+f.Path)
	}
	if err := measure("curl (1 connection per file, no verification)", curlDir, exec.Command(*curl, args...)); err != nil {
		return err
	}

	fetchRun := func(name string, extra ...string) error {
		dest := filepath.Join(*work, "fetch")
		a := append([]string{"--source", "hf://bench/synthetic", "--hf-endpoint", srv.URL, "--dest", dest,
			"--concurrency", fmt.Sprint(*concurrency), "--chunk-size", *chunk, "--min-free", "0",
			"--progress-bar", "never", "--log-format", "json"}, extra...)
		return measure(name, dest, exec.Command(*fetchBin, a...))
	}
	if err := fetchRun(fmt.Sprintf("orchestra-fetch, %d ranges, sha256 on", *concurrency)); err != nil {
		return err
	}
	if err := fetchRun(fmt.Sprintf("orchestra-fetch, %d ranges, sha256 off", *concurrency), "--verify-sha256=false"); err != nil {
		return err
	}
	if err := fetchRun("orchestra-fetch, 1 range, sha256 on", "--concurrency", "1"); err != nil {
		return err
	}

	table := render(results, size, *files, *chunk, hashTime)
	fmt.Println(table)
	if *docs != "" {
		if err := updateDocs(*docs, table); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "updated %s\n", *docs)
	}
	return nil
}

func render(results []result, size int64, files int, chunk string, hashTime time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s/%s, %d CPUs (shared machine), %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(&b, "Repository: %s in %d files, generated on the fly by the fake hub on loopback "+
		"(the hub and the client share the CPUs). Chunk size %s. ", fetch.FormatBytes(size), files, chunk)
	fmt.Fprintf(&b, "Generating and sha256-hashing the bytes once in one goroutine (for the listing) took %.1f s (%.0f MiB/s).\n\n",
		hashTime.Seconds(), float64(size)/(1<<20)/hashTime.Seconds())
	b.WriteString("| Run | Wall time (s) | Throughput (MiB/s) | vs curl | Client CPU (s) |\n")
	b.WriteString("|---|---:|---:|---:|---:|\n")
	base := results[0].mibps()
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %.2f | %.0f | %.0f%% | %.2f |\n", r.name, r.wall.Seconds(), r.mibps(), 100*r.mibps()/base, r.cpu.Seconds())
	}
	b.WriteString("\norchestra-fetch also journals every chunk, fsyncs partial files every few seconds and each file before " +
		"publishing it (rename into place); curl does none of this. CPU is user+system time of the client process.\n")
	return b.String()
}

// updateDocs replaces the text between the markers, adding them at the end
// when absent; the rest of the file is left untouched.
func updateDocs(path, table string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s := string(old)
	block := startMarker + "\n" + table + endMarker
	i, j := strings.Index(s, startMarker), strings.Index(s, endMarker)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + block + s[j+len(endMarker):]
	case i >= 0 || j >= 0:
		return fmt.Errorf("%s has only one of the bench-fetch markers; fix it by hand", path)
	default:
		if s == "" {
			s = "# Benchmarks\n"
		}
		if !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		s += "\n## orchestra-fetch (make bench-fetch)\n\n" + block + "\n"
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".orchestra" {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
