package sidecar

// The sidecar hands its engine's model files to the node agent on its
// node (sidecarapi.PathModelFiles), so that the agent can place its hot
// and warm copies from a model cache it cannot mount (a ReadWriteOnce
// claim attaches to the engine's node only, and only the engine's pod
// mounts it). It serves only the files the fetcher's manifest lists for
// the engine's model, complete and with their sha256, and names each
// file's sha256; the node agent verifies every byte against it and owns
// the copies. Both reads require the release's caller token.

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/model-orchestra/operator/internal/agenthttp"
	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// errNotVouched means the manifest cannot vouch for the model's files:
// the sidecar hands none of them out.
var errNotVouched = errors.New("the fetcher's manifest does not vouch for the model's files")

// ModelFilesOf lists the files of the model root (a file or a directory
// inside the model cache modelDir, "" for the whole cache) as the
// fetcher's manifest records them. The manifest must be complete and give
// each file a sha256; a root that is neither a listed file nor a
// directory holding one is an error.
func ModelFilesOf(modelDir, root string) (sidecarapi.ModelFiles, error) {
	root = strings.Trim(filepath.ToSlash(root), "/")
	if root != "" && !sidecarapi.LocalPath(root) {
		return sidecarapi.ModelFiles{}, fmt.Errorf("model %q must be a path inside the model cache", root)
	}
	man, err := fetch.ReadManifest(modelDir)
	switch {
	case err != nil:
		return sidecarapi.ModelFiles{}, err
	case man == nil:
		return sidecarapi.ModelFiles{}, fmt.Errorf("%w: the model cache %s has no manifest", errNotVouched, modelDir)
	case !man.Complete:
		return sidecarapi.ModelFiles{}, fmt.Errorf("%w: the manifest of %s is not complete (the fetch has not finished)", errNotVouched, modelDir)
	}
	out := sidecarapi.ModelFiles{Root: root}
	for _, f := range man.Files {
		rel := ""
		switch {
		case f.Path == root:
			rel = path.Base(f.Path)
		case root == "":
			rel = f.Path
		case strings.HasPrefix(f.Path, root+"/"):
			rel = strings.TrimPrefix(f.Path, root+"/")
		default:
			continue
		}
		if !sidecarapi.LocalPath(rel) {
			return sidecarapi.ModelFiles{}, fmt.Errorf("%w: the manifest lists %q, not a path inside the cache", errNotVouched, f.Path)
		}
		if f.SHA256 == "" {
			return sidecarapi.ModelFiles{}, fmt.Errorf("%w: the manifest lists %s without a sha256", errNotVouched, f.Path)
		}
		if f.Path == root {
			return sidecarapi.ModelFiles{Root: root, Files: []sidecarapi.ModelFile{{Path: rel, Bytes: f.Size, SHA256: strings.ToLower(f.SHA256)}}}, nil
		}
		out.Dir = true
		out.Files = append(out.Files, sidecarapi.ModelFile{Path: rel, Bytes: f.Size, SHA256: strings.ToLower(f.SHA256)})
	}
	if len(out.Files) == 0 {
		return out, fmt.Errorf("%w: the manifest lists no file of %q", errNotVouched, root)
	}
	return out, nil
}

// ModelFilesHandler serves GET /model/files and GET /model/files/{path}
// of the model root in modelDir, to callers with the token in tok (any
// caller when tok is empty, as the sidecar's other endpoints).
func ModelFilesHandler(modelDir, root string, tok nodeapi.TokenFile) http.Handler {
	mux := http.NewServeMux()
	list := func(w http.ResponseWriter) (sidecarapi.ModelFiles, bool) {
		files, err := ModelFilesOf(modelDir, root)
		if err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, errNotVouched) {
				status = http.StatusConflict
			}
			agenthttp.WriteError(w, status, err.Error())
			return files, false
		}
		return files, true
	}
	mux.HandleFunc("GET "+sidecarapi.PathModelFiles, func(w http.ResponseWriter, _ *http.Request) {
		if files, ok := list(w); ok {
			agenthttp.WriteJSON(w, http.StatusOK, files)
		}
	})
	mux.HandleFunc("GET "+sidecarapi.PathModelFiles+"/{path...}", func(w http.ResponseWriter, r *http.Request) {
		files, ok := list(w)
		if !ok {
			return
		}
		p := r.PathValue("path")
		var want *sidecarapi.ModelFile
		for i := range files.Files {
			if files.Files[i].Path == p {
				want = &files.Files[i]
			}
		}
		if want == nil {
			agenthttp.WriteError(w, http.StatusNotFound, fmt.Sprintf("%s is not a file of the model %q the manifest lists", p, files.Root))
			return
		}
		name := filepath.Join(modelDir, filepath.FromSlash(files.Root))
		if files.Dir {
			name = filepath.Join(name, filepath.FromSlash(p))
		}
		f, err := os.Open(name)
		if err != nil {
			agenthttp.WriteError(w, http.StatusInternalServerError, err.Error())
			return
		}
		defer func() { _ = f.Close() }() // read-only
		fi, err := f.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			agenthttp.WriteError(w, http.StatusInternalServerError, fmt.Sprintf("%s is not a regular file", name))
			return
		}
		// The file's own size: a file that differs from the manifest is
		// sent as it is, and the agent refuses it.
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		w.Header().Set(sidecarapi.HeaderSHA256, want.SHA256)
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, f) // a broken copy ends short; the agent counts the bytes
	})
	if tok == "" {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if nodeapi.Caller(tok, w, r, agenthttp.WriteError) {
			mux.ServeHTTP(w, r)
		}
	})
}

// withModelFiles adds the model's files (ModelFilesHandler) to the
// sidecar's API h when it points its engine at copies (cfg enabled), for
// the callers with the token in tokenFile.
func withModelFiles(h http.Handler, cfg ModelCopiesConfig, tokenFile string) http.Handler {
	if !cfg.Enabled() {
		return h
	}
	files := ModelFilesHandler(cfg.ModelDir, cfg.File, nodeapi.TokenFile(tokenFile))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == sidecarapi.PathModelFiles || strings.HasPrefix(r.URL.Path, sidecarapi.PathModelFiles+"/") {
			files.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
