// Command hubmirror serves a local directory as a Hugging Face compatible
// hub, so orchestra-fetch (and the `make run` demo) work without internet:
//
//	hubmirror --root ./models --listen :8088
//	orchestra-fetch --source hf://demo/tiny --hf-endpoint http://127.0.0.1:8088 --dest /tmp/tiny
//
// Every <root>/<org>/<name>/ directory is a repository; its files are served
// at revision "main". Files of 1 MiB or more, and weights (.safetensors,
// .gguf, .bin, .pt, .m), are served as LFS files with their sha256.
//
// --file ORG/NAME=PATH (repeatable) serves one file of your own, a GGUF
// model of any size, as the only file of repository ORG/NAME, read in place
// (no copy):
//
//	hubmirror --root ./models --file local/my-model=$HOME/models/x.gguf
//
// serves hf://local/my-model with the file x.gguf.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
)

func main() {
	root := flag.String("root", "", "directory holding <org>/<name>/ repositories")
	listen := flag.String("listen", "127.0.0.1:8088", "address to serve on")
	token := flag.String("token", "", "require this bearer token (default: none)")
	var files fileFlags
	flag.Var(&files, "file", "serve a file of yours as the only file of a repository: ORG/NAME=PATH (repeatable)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *root == "" {
		fmt.Fprintln(os.Stderr, "hubmirror: --root is required")
		os.Exit(2)
	}
	repos, err := loadRepos(*root)
	if err != nil {
		log.Error("loading repositories", "root", *root, "err", err)
		os.Exit(1)
	}
	for _, f := range files {
		r, err := fileRepo(f.repo, f.path)
		if err != nil {
			log.Error("serving a file", "file", f.repo+"="+f.path, "err", err)
			os.Exit(1)
		}
		repos = append(repos, r)
	}
	if len(repos) == 0 {
		log.Warn("no <org>/<name> repositories found", "root", *root)
	}
	srv := &hubtest.Server{Token: *token}
	for _, r := range repos {
		srv.AddRepo(r)
		log.Info("serving repository", "repo", "hf://"+r.ID, "files", len(r.Files))
	}
	srv.SetCDNBase("") // relative redirects: works under any host name
	log.Info("hub mirror listening", "addr", *listen)
	hs := &http.Server{Addr: *listen, Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("serving", "err", err)
		os.Exit(1)
	}
}

// fileFlag is one --file ORG/NAME=PATH.
type fileFlag struct{ repo, path string }

type fileFlags []fileFlag

func (f *fileFlags) String() string { return fmt.Sprint(*f) }

func (f *fileFlags) Set(v string) error {
	repo, path, ok := strings.Cut(v, "=")
	org, name, ok2 := strings.Cut(repo, "/")
	if !ok || !ok2 || org == "" || name == "" || strings.Contains(name, "/") || path == "" {
		return fmt.Errorf("%q: want ORG/NAME=PATH, e.g. local/my-model=/models/x.gguf", v)
	}
	*f = append(*f, fileFlag{repo: repo, path: path})
	return nil
}

// fileRepo is the repository id with the one file at path, served under
// its base name and read in place.
func fileRepo(id, path string) (*hubtest.Repo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	c, err := fetchtest.File(path)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(path)
	return &hubtest.Repo{ID: id, Files: []hubtest.File{{Path: name, Content: c, LFS: isLFS(name, c.Size())}}}, nil
}

func isLFS(name string, size int64) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".safetensors", ".gguf", ".bin", ".pt", ".pth", ".m":
		return true
	}
	return size >= 1<<20
}

func loadRepos(root string) ([]*hubtest.Repo, error) {
	orgs, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var repos []*hubtest.Repo
	for _, org := range orgs {
		if !org.IsDir() || strings.HasPrefix(org.Name(), ".") {
			continue
		}
		names, err := os.ReadDir(filepath.Join(root, org.Name()))
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if !name.IsDir() || strings.HasPrefix(name.Name(), ".") {
				continue
			}
			dir := filepath.Join(root, org.Name(), name.Name())
			repo := &hubtest.Repo{ID: org.Name() + "/" + name.Name()}
			err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if d.IsDir() {
					if p != dir && strings.HasPrefix(d.Name(), ".") {
						return filepath.SkipDir
					}
					return nil
				}
				if !d.Type().IsRegular() {
					return nil
				}
				c, err := fetchtest.File(p)
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(dir, p)
				repo.Files = append(repo.Files, hubtest.File{Path: filepath.ToSlash(rel), Content: c, LFS: isLFS(p, c.Size())})
				return nil
			})
			if err != nil {
				return nil, err
			}
			repos = append(repos, repo)
		}
	}
	return repos, nil
}
