package arena

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a byte count that parses and prints binary units ("256MiB",
// "4GiB", or a plain number). It implements flag.Value and pflag.Value.
type Size int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
}

// ParseSize reads sizes such as 256MiB, 1GiB, 4Gi, 10MB or 1048576.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n < 0 || n*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("invalid size %q: want a number of bytes such as 1073741824, 1GiB or 0.25GiB", s)
	}
	return Size(n * float64(mult)), nil
}

// String prints the size with the largest binary unit that keeps it exact
// to two decimals.
func (s Size) String() string {
	for _, u := range sizeUnits[:4] {
		if int64(s) >= u.mult {
			v := float64(s) / float64(u.mult)
			return strconv.FormatFloat(v, 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// Set implements flag.Value.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// Type implements pflag.Value.
func (s *Size) Type() string { return "size" }
