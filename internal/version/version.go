// Package version holds the operator version, set at build time, and the
// names of the images that the charts reference.
package version

// Version is the operator version. The Makefile sets it with
// -ldflags "-X github.com/model-orchestra/operator/internal/version.Version=$(VERSION)".
var Version = "1.0.0"

// ImageRepository is where the project's images are published.
const ImageRepository = "ghcr.io/model-orchestra"

// Image returns the reference of one of the project's images at this
// operator version, for example Image("orchestra-gateway").
func Image(name string) string {
	return ImageRepository + "/" + name + ":v" + Version
}
