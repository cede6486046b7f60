package yamldocs

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Decode returns the objects of the documents in data, in order, leaving
// out empty documents (a leading "---", a comment-only document).
func Decode(data []byte) ([]map[string]any, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []map[string]any
	for i := 1; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode document %d: %w", i, err)
		}
		if len(m) > 0 {
			objs = append(objs, m)
		}
	}
}
