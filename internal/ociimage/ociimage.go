// Package ociimage packs a static binary into a container image tarball
// without Docker: no base image, no shell, just the binary (and optional
// extra files) in a single layer, run as a non-root user.
//
// The result is a docker-archive tarball, the format of `docker save`,
// which `ctr images import`, `docker load` and `podman load` accept. Packing
// is reproducible: the same inputs give the same image digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultUser is the numeric user and group the image runs as, the
// "nonroot" user of distroless images.
const DefaultUser = "65532:65532"

// epoch is the timestamp of every file and of the image itself, so that
// packing is reproducible.
var epoch = time.Unix(0, 0).UTC()

// Options describe the image to build.
type Options struct {
	// Binary is the path of the executable to pack. Required. It should be
	// static (CGO_ENABLED=0): the image has no libc.
	Binary string
	// Ref tags the image, for example
	// "ghcr.io/model-orchestra/orchestra-gateway:v0.1.0". Required.
	Ref string
	// Out is the tarball to write. Required.
	Out string
	// Path is where the binary goes in the image. Default "/<base name of
	// Binary>".
	Path string
	// Args are appended to the entrypoint as the image's default command.
	Args []string
	// User is "uid:gid" (numeric). Default DefaultUser.
	User string
	// Ports are exposed ports such as "8080" or "53/udp"; "/tcp" is
	// implied.
	Ports []string
	// Env entries ("KEY=value") set in the image config.
	Env []string
	// Labels set in the image config.
	Labels map[string]string
	// Files are extra files, keyed by absolute path in the image, with the
	// host path as value. They are world-readable, and executable by all
	// when the host file is executable.
	Files map[string]string
	// Platform of the binary. Default linux/amd64.
	OS, Architecture string
}

// ErrInvalidOptions wraps every validation failure of Options.
var ErrInvalidOptions = errors.New("invalid image options")

// Default fills unset fields.
func (o Options) Default() Options {
	if o.Path == "" && o.Binary != "" {
		o.Path = "/" + filepath.Base(o.Binary)
	}
	if o.User == "" {
		o.User = DefaultUser
	}
	if o.OS == "" {
		o.OS = "linux"
	}
	if o.Architecture == "" {
		o.Architecture = "amd64"
	}
	return o
}

// Validate reports the first problem with defaulted options.
func (o Options) Validate() error {
	switch {
	case o.Binary == "":
		return fmt.Errorf("%w: no binary", ErrInvalidOptions)
	case o.Ref == "":
		return fmt.Errorf("%w: no image reference", ErrInvalidOptions)
	case o.Out == "":
		return fmt.Errorf("%w: no output file", ErrInvalidOptions)
	case !path.IsAbs(o.Path):
		return fmt.Errorf("%w: path in image %q is not absolute", ErrInvalidOptions, o.Path)
	}
	if _, err := name.NewTag(o.Ref); err != nil {
		return fmt.Errorf("%w: reference %q: %w", ErrInvalidOptions, o.Ref, err)
	}
	uid, gid, ok := strings.Cut(o.User, ":")
	if _, err := strconv.ParseUint(uid, 10, 32); err != nil || !ok {
		return fmt.Errorf("%w: user %q is not numeric uid:gid", ErrInvalidOptions, o.User)
	}
	if _, err := strconv.ParseUint(gid, 10, 32); err != nil {
		return fmt.Errorf("%w: user %q is not numeric uid:gid", ErrInvalidOptions, o.User)
	}
	for _, p := range o.Ports {
		num, proto, _ := strings.Cut(p, "/")
		if n, err := strconv.ParseUint(num, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("%w: port %q", ErrInvalidOptions, p)
		}
		if proto != "" && proto != "tcp" && proto != "udp" && proto != "sctp" {
			return fmt.Errorf("%w: port %q has unknown protocol", ErrInvalidOptions, p)
		}
	}
	for dst := range o.Files {
		if !path.IsAbs(dst) {
			return fmt.Errorf("%w: file path in image %q is not absolute", ErrInvalidOptions, dst)
		}
	}
	return nil
}

// Pack builds the image and writes it to o.Out. It returns the image
// digest.
func Pack(o Options) (v1.Hash, error) {
	o = o.Default()
	if err := o.Validate(); err != nil {
		return v1.Hash{}, err
	}
	img, err := Build(o)
	if err != nil {
		return v1.Hash{}, err
	}
	tag, err := name.NewTag(o.Ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return v1.Hash{}, fmt.Errorf("creating output directory: %w", err)
	}
	// Write next to the target and rename, so a reader never sees half a file.
	tmp := o.Out + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		_ = os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("writing %s: %w", o.Out, err)
	}
	if err := os.Rename(tmp, o.Out); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// Build returns the image without writing it.
func Build(o Options) (v1.Image, error) {
	o = o.Default()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	layerData, err := layerTar(o)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("building layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("building image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = o.OS
	cfg.Architecture = o.Architecture
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = []string{o.Path}
	cfg.Config.Cmd = o.Args
	cfg.Config.User = o.User
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = append([]string{"PATH=/"}, o.Env...)
	cfg.Config.Labels = o.Labels
	if len(o.Ports) > 0 {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range o.Ports {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			cfg.Config.ExposedPorts[p] = struct{}{}
		}
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("setting image config: %w", err)
	}
	return img, nil
}

// layerTar is the single layer: /tmp (sticky, world-writable, as programs
// expect), the parent directories of every file, the binary and the extra
// files, in a fixed order with fixed timestamps.
func layerTar(o Options) ([]byte, error) {
	type entry struct {
		dst, src string
		mode     int64
	}
	entries := []entry{{dst: o.Path, src: o.Binary, mode: 0o755}}
	for dst, src := range o.Files {
		mode := int64(0o644)
		if fi, err := os.Stat(src); err == nil && fi.Mode()&0o111 != 0 {
			mode = 0o755 // a program, such as a shell
		}
		entries = append(entries, entry{dst: dst, src: src, mode: mode})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].dst < entries[j].dst })

	dirs := map[string]bool{"tmp": true}
	for _, e := range entries {
		for d := path.Dir(strings.TrimPrefix(e.dst, "/")); d != "." && d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirList {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		hdr := &tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: mode, ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		data, err := os.ReadFile(e.src)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", e.src, err)
		}
		hdr := &tar.Header{
			Name:     strings.TrimPrefix(e.dst, "/"),
			Typeflag: tar.TypeReg,
			Mode:     e.mode,
			Size:     int64(len(data)),
			ModTime:  epoch,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
