// Command olm is the developer CLI of the OLM delivery: it generates and
// validates the operator bundle, renders and validates the File-Based
// Catalog, and checks CRD compatibility with earlier releases. The Makefile
// targets bundle, validate-bundle, catalog, validate-catalog and
// check-crd-compat call it:
//
//	go run ./hack/olm bundle --version 1.0.0
//	go run ./hack/olm validate-bundle
//	go run ./hack/olm catalog
//	go run ./hack/olm validate-catalog
//	go run ./hack/olm check-crd-compat
//
// Paths are relative to --root, the repository root (default ".").
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
)

func main() {
	// operator-registry logs through logrus; its info lines ("Could not
	// find optional dependencies file") are noise here.
	logrus.SetLevel(logrus.WarnLevel)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		if !errors.Is(err, errFindings) {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(1)
	}
}

// errFindings is returned when a validator reported errors; they are
// already printed.
var errFindings = errors.New("validation failed")

func newRootCommand() *cobra.Command {
	var root string
	cmd := &cobra.Command{
		Use:           "olm",
		Short:         "Generate and validate the OLM bundle and catalog of the Model Orchestra operator",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.PersistentFlags().StringVar(&root, "root", ".", "repository root")
	cmd.AddCommand(
		newBundleCommand(&root),
		newValidateBundleCommand(&root),
		newCatalogCommand(&root),
		newValidateCatalogCommand(&root),
		newCRDCompatCommand(&root),
	)
	return cmd
}
