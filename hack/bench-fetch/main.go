// Command bench-fetch measures orchestra-fetch against curl on the same
// bytes: a deterministic synthetic repository, written to disk before the
// measurement and served from loopback by the fake hub with sendfile(2).
// Every configuration runs --repeat times, interleaved, and the median run
// is reported. It prints a table and writes it into docs/benchmarks.md
// between the <!-- bench-fetch:start --> and <!-- bench-fetch:end -->
// markers.
//
//	go run ./hack/bench-fetch --size 2GiB
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
)

const (
	startMarker = "<!-- bench-fetch:start -->"
	endMarker   = "<!-- bench-fetch:end -->"
)

// sample is one timed run of one configuration.
type sample struct {
	wall      time.Duration
	clientCPU time.Duration // user+system of the client process
	hubCPU    time.Duration // user+system of this process (the hub) meanwhile
	otherCPU  time.Duration // busy CPU time of the rest of the machine meanwhile
}

// config is one row of the table.
type config struct {
	name    string
	cmd     func(dir string) *exec.Cmd
	notBase bool // a curl row that is not a candidate for the baseline
	samples []sample
}

// median returns the sample with the median wall time.
func (c *config) median() sample {
	s := slices.Clone(c.samples)
	slices.SortFunc(s, func(a, b sample) int { return int(a.wall - b.wall) })
	return s[len(s)/2]
}

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
	repeat := flag.Int("repeat", 5, "runs of every configuration (the median is reported)")
	fetchBin := flag.String("fetch-bin", "", "orchestra-fetch binary (built into the work dir when empty)")
	curl := flag.String("curl", "/usr/bin/curl", "curl binary")
	work := flag.String("work", "", "scratch directory (default: a new one in $TMPDIR)")
	docs := flag.String("docs", "docs/benchmarks.md", "markdown file to update between the markers (empty: print only)")
	quiet := flag.Duration("quiet-wait", 2*time.Minute, "before each run, wait up to this long for the rest of the machine to be idle")
	flag.Parse()

	size, err := fetch.ParseBytes(*sizeFlag)
	if err != nil {
		return err
	}
	if *repeat < 1 {
		return fmt.Errorf("--repeat %d: want at least 1", *repeat)
	}
	if *work == "" {
		if *work, err = os.MkdirTemp("", "bench-fetch-"); err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(*work) }() // best-effort cleanup of a temp dir
	}
	if err := checkSpace(*work, size); err != nil {
		return err
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

	// The repository: files written to disk once, before any measurement,
	// listed as LFS with the sha256 computed while writing them.
	fmt.Fprintf(os.Stderr, "writing the %s synthetic repository ...\n", fetch.FormatBytes(size))
	repo := &hubtest.Repo{ID: "bench/synthetic"}
	per := size / int64(*files)
	for i := 0; i < *files; i++ {
		n := per
		if i == *files-1 {
			n = size - per*int64(*files-1)
		}
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, *files)
		p := filepath.Join(*work, "src", name)
		sum, err := writeSynthetic(p, n, uint64(i+1))
		if err != nil {
			return err
		}
		c, err := fetchtest.File(p)
		if err != nil {
			return err
		}
		repo.Files = append(repo.Files, hubtest.File{Path: name, Content: c, LFS: true, ListedSHA256: sum})
	}
	hub := &hubtest.Server{}
	hub.AddRepo(repo)
	hub.SetCDNBase("")
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()

	// curl: one connection per file, the files one after the other (the
	// way a script would call it) and all at once with --parallel.
	curlCmd := func(parallel, sync bool) func(dir string) *exec.Cmd {
		return func(dir string) *exec.Cmd {
			args := []string{"-sS", "-f", "-L"}
			if parallel {
				args = append(args, "--parallel", "--parallel-max", fmt.Sprint(*files))
			}
			var outs []string
			for _, f := range repo.Files {
				out := filepath.Join(dir, f.Path)
				outs = append(outs, out)
				args = append(args, "-o", out, srv.URL+"/bench/synthetic/resolve/main/"+f.Path)
			}
			if !sync {
				return exec.Command(*curl, args...)
			}
			// sync(1) with file arguments fsyncs those files.
			script := `"$0" "$@" && sync`
			for _, out := range outs {
				script += " '" + strings.ReplaceAll(out, "'", `'\''`) + "'"
			}
			return exec.Command("sh", append([]string{"-c", script, *curl}, args...)...)
		}
	}
	fetchCmd := func(extra ...string) func(dir string) *exec.Cmd {
		return func(dir string) *exec.Cmd {
			a := append([]string{"--source", "hf://bench/synthetic", "--hf-endpoint", srv.URL, "--dest", dir,
				"--concurrency", fmt.Sprint(*concurrency), "--chunk-size", *chunk, "--min-free", "0",
				"--progress-bar", "never", "--log-format", "json"}, extra...)
			return exec.Command(*fetchBin, a...)
		}
	}
	configs := []*config{
		{name: "curl, 1 connection per file, files in turn", cmd: curlCmd(false, false)},
		{name: fmt.Sprintf("curl --parallel, 1 connection per file, %d at once", *files), cmd: curlCmd(true, false)},
		{name: "curl, files in turn, then sync(1) of the files", cmd: curlCmd(false, true), notBase: true},
		{name: fmt.Sprintf("orchestra-fetch, %d ranges, sha256 on", *concurrency), cmd: fetchCmd()},
		{name: fmt.Sprintf("orchestra-fetch, %d ranges, sha256 off", *concurrency), cmd: fetchCmd("--verify-sha256=false")},
		{name: "orchestra-fetch, 1 range, sha256 on", cmd: fetchCmd("--concurrency", "1")},
	}
	dest := filepath.Join(*work, "dest")
	busyStarts := 0
	for r := 0; r < *repeat; r++ {
		for _, c := range configs {
			fmt.Fprintf(os.Stderr, "run %d/%d: %s ...\n", r+1, *repeat, c.name)
			if !waitQuiet(*quiet) {
				fmt.Fprintf(os.Stderr, "  the machine is still busy after %s; running anyway\n", *quiet)
				busyStarts++
			}
			// The first round also checks every client wrote the right bytes.
			s, err := measure(c.cmd(dest), dest, size, r == 0, repo)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			c.samples = append(c.samples, s)
			fmt.Fprintf(os.Stderr, "  %.2f s; CPU: client %.2f s, hub %.2f s, rest %.2f s\n",
				s.wall.Seconds(), s.clientCPU.Seconds(), s.hubCPU.Seconds(), s.otherCPU.Seconds())
		}
	}

	fmt.Fprintln(os.Stderr, "timing sha256 on one core ...")
	waitQuiet(*quiet)
	hashRate := sha256Rate()
	table := render(configs, size, *files, *chunk, *repeat, busyStarts, hashRate)
	fmt.Println(table)
	if *docs != "" {
		if err := updateDocs(*docs, table); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "updated %s\n", *docs)
	}
	return nil
}

// checkSpace wants room for the source and one downloaded copy (each run's
// copy is removed before the next run).
func checkSpace(dir string, size int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err
	}
	free := int64(st.Bavail) * int64(st.Bsize) //nolint:unconvert // Bsize is int32 on 386
	if need := 2*size + 1<<30; free < need {
		return fmt.Errorf("%s has %s free, the benchmark needs %s", dir, fetch.FormatBytes(free), fetch.FormatBytes(need))
	}
	return nil
}

// writeSynthetic writes n deterministic bytes for seed to p and returns
// their sha256.
func writeSynthetic(p string, n int64, seed uint64) (string, error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if _, err := io.Copy(w, io.NewSectionReader(fetchtest.Synthetic(n, seed), 0, n)); err != nil {
		_ = f.Close() // the copy error is what matters
		return "", err
	}
	if err := w.Flush(); err != nil {
		_ = f.Close() // the flush error is what matters
		return "", err
	}
	// On disk before the runs, so that its writeback does not compete with them.
	if err := f.Sync(); err != nil {
		_ = f.Close() // the sync error is what matters
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// measure runs cmd, checks it wrote size bytes into dir (and, with check,
// the bytes of repo, outside the timed part) and removes them.
func measure(cmd *exec.Cmd, dir string, size int64, check bool, repo *hubtest.Repo) (sample, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return sample{}, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	hubBefore, busyBefore := selfCPU(), machineBusy()
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	hubCPU, busy := selfCPU()-hubBefore, machineBusy()-busyBefore
	if err != nil {
		return sample{}, fmt.Errorf("%w\n%s", err, tail(stderr.String(), 2000))
	}
	got, err := dirBytes(dir)
	if err != nil {
		return sample{}, err
	}
	if got != size {
		return sample{}, fmt.Errorf("wrote %d bytes, want %d", got, size)
	}
	if check {
		for _, f := range repo.Files {
			sum, err := fileSHA256(filepath.Join(dir, f.Path))
			if err != nil {
				return sample{}, err
			}
			if sum != f.ListedSHA256 {
				return sample{}, fmt.Errorf("%s: sha256 %s, want %s", f.Path, sum, f.ListedSHA256)
			}
		}
	}
	s := sample{wall: wall, hubCPU: hubCPU, clientCPU: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
	s.otherCPU = max(0, busy-s.hubCPU-s.clientCPU)
	return s, os.RemoveAll(dir) // never keep two copies on disk
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }() // opened read-only
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// machineBusy is the CPU time all CPUs spent busy since boot (user, nice,
// system, irq and softirq in /proc/stat), or 0 where that is unknown.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// waitQuiet waits until the machine (this process included) used less than
// a fifth of one CPU over half a second, for at most limit.
func waitQuiet(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		before := machineBusy()
		time.Sleep(500 * time.Millisecond)
		if machineBusy()-before < 100*time.Millisecond {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// selfCPU is the user+system time of this process (the hub) so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sha256Rate is bytes per second of crypto/sha256 on one goroutine, over
// 256 MiB of a buffer already in the CPU caches' reach.
func sha256Rate() float64 {
	buf := fetchtest.Random(1<<20, 1)
	h := sha256.New()
	start := time.Now()
	for i := 0; i < 256; i++ {
		h.Write(buf)
	}
	return float64(256<<20) / time.Since(start).Seconds()
}

func render(configs []*config, size int64, files int, chunk string, repeat, busyStarts int, hashRate float64) string {
	mibps := func(s sample) float64 { return float64(size) / (1 << 20) / s.wall.Seconds() }
	var b strings.Builder
	// No date or commit: the docs hold the result, the commit message its history.
	fmt.Fprintf(&b, "Measured on %s/%s, %d CPUs (shared machine), %s.\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(&b, "Repository: %s in %d files, written to disk before the runs and served from the page cache by "+
		"the fake hub on loopback with sendfile(2), as a mirror or CDN serves files; the hub and the client share the CPUs. "+
		"Every client writes the files to disk. Chunk size %s. Each row is the run with the median wall time of %d, "+
		"the configurations interleaved", fetch.FormatBytes(size), files, chunk, repeat)
	if busyStarts > 0 {
		fmt.Fprintf(&b, " (%d of the %d runs started while the machine was still busy)", busyStarts, repeat*len(configs))
	}
	b.WriteString(".\n\n")
	b.WriteString("| Run | Wall time (s) | Throughput (MiB/s) | vs curl | Client CPU (s) | Hub CPU (s) | Rest of machine CPU (s) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	base := 0.0
	for _, c := range configs {
		if strings.HasPrefix(c.name, "curl") && !c.notBase {
			base = max(base, mibps(c.median()))
		}
	}
	for _, c := range configs {
		m := c.median()
		fmt.Fprintf(&b, "| %s | %.2f | %.0f | %.0f%% | %.2f | %.2f | %.2f |\n",
			c.name, m.wall.Seconds(), mibps(m), 100*mibps(m)/base, m.clientCPU.Seconds(), m.hubCPU.Seconds(), m.otherCPU.Seconds())
	}
	hashCPU := float64(size) / hashRate
	fmt.Fprintf(&b, "\n\"vs curl\" compares with the faster of the first two curl rows (the third adds making the files "+
		"durable, which orchestra-fetch does and plain curl does not). crypto/sha256 hashes %.0f MiB/s on one core here, "+
		"so verifying %s costs at least %.2f s of CPU", hashRate/(1<<20), fetch.FormatBytes(size), hashCPU)
	var on, off *config
	for _, c := range configs {
		switch {
		case strings.Contains(c.name, "ranges, sha256 on"):
			on = c
		case strings.Contains(c.name, "ranges, sha256 off"):
			off = c
		}
	}
	if on != nil && off != nil {
		fmt.Fprintf(&b, "; with %s it added %.2f s of client CPU and %.2f s of wall time",
			strings.TrimPrefix(on.name, "orchestra-fetch, "), (on.median().clientCPU - off.median().clientCPU).Seconds(),
			(on.median().wall - off.median().wall).Seconds())
	}
	b.WriteString(". orchestra-fetch also journals every chunk, fsyncs partial files every few seconds and each file " +
		"before publishing it (rename into place); plain curl does none of this. Client CPU is user+system time of the " +
		"client process; hub CPU is that of the benchmark process serving it meanwhile; rest of machine is the busy time " +
		"of all other processes and the kernel's own threads meanwhile (other work on the shared machine, writeback of " +
		"the files to disk, page reclaim). Before each run the benchmark waits until the machine is idle.\n")
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
