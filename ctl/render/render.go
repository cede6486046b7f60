package render

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"
)

// Format is an output format.
type Format string

const (
	Table Format = "table"
	YAML  Format = "yaml"
	JSON  Format = "json"
)

// ParseFormat reads -o's value; empty is Table.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case "", Table:
		return Table, nil
	case YAML, JSON:
		return f, nil
	}
	return "", fmt.Errorf("output format %q: want table, yaml or json", s)
}

// Print writes data in format f; table writes the table form.
func Print(w io.Writer, f Format, data any, table func(io.Writer) error) error {
	switch f {
	case YAML:
		b, err := yaml.Marshal(data)
		if err != nil {
			return fmt.Errorf("render yaml: %w", err)
		}
		_, err = w.Write(b)
		return err
	case JSON:
		b, err := json.MarshalIndent(data, "", "  ")
		if err != nil {
			return fmt.Errorf("render json: %w", err)
		}
		_, err = w.Write(append(b, '\n'))
		return err
	}
	return table(w)
}

// tw is a tabwriter with kubectl's spacing; flush it.
func tw(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0) }

// row writes tab-separated cells and a newline.
func row(w io.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(w, "\t")
		}
		fmt.Fprint(w, c)
	}
	io.WriteString(w, "\n")
}

// block writes "Key:  value" lines with values aligned, indented by
// indent spaces; multi-line values continue under the value column.
type block struct {
	w      io.Writer
	indent int
	pairs  [][2]string
}

func newBlock(w io.Writer, indent int) *block { return &block{w: w, indent: indent} }

func (b *block) add(key string, format string, args ...any) {
	b.pairs = append(b.pairs, [2]string{key, fmt.Sprintf(format, args...)})
}

// keyWidth aligns every block's values in one column, so nested blocks of
// one answer read as one.
const keyWidth = 20

func (b *block) flush() {
	width := keyWidth - b.indent
	for _, p := range b.pairs {
		width = max(width, len(p[0])+1)
	}
	pad := strings.Repeat(" ", b.indent)
	for _, p := range b.pairs {
		key := p[0] + ":"
		if p[0] == "" {
			key = ""
		}
		lines := strings.Split(p[1], "\n")
		fmt.Fprintf(b.w, "%s%-*s  %s\n", pad, width, key, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(b.w, "%s%-*s  %s\n", pad, width, "", l)
		}
	}
	b.pairs = nil
}

// age prints d as kubectl does: 45s, 3m12s, 2h5m, 3d4h.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// counts prints a map as "k=v k=v" in key order, zero values left out;
// "-" when nothing is left.
func counts[V cmp.Ordered](m map[string]V, format string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		var zero V
		if m[k] == zero {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s="+format, k, m[k]))
	}
	if parts == nil {
		return "-"
	}
	return strings.Join(parts, " ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
