package appapi

import "encoding/json"

// Call asks the app client for one request from inside its pod.
type Call struct {
	URL string `json:"url"`
	// Mode: http1 (plaintext HTTP/1.1), h2c (HTTP/2 with prior knowledge),
	// h2c-kept (h2c over one connection kept between calls while the
	// server lets it, as a gRPC channel keeps one) or websocket (an
	// HTTP/1.1 upgrade; the server's first message is the body, Message is
	// then sent and its echo read).
	Mode    string `json:"mode"`
	Message string `json:"message,omitempty"`
}

// Result is what the request got.
type Result struct {
	Status int             `json:"status,omitempty"`
	Proto  string          `json:"proto,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
	Text   string          `json:"text,omitempty"`
	Echo   string          `json:"echo,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// Inspection is what the container the app client runs in was given.
type Inspection struct {
	CapEff  string            `json:"capEff"`
	FS      map[string]string `json:"fs"`
	HostPID bool              `json:"hostPID"`
	// Listeners are the listening TCP sockets of this network namespace,
	// whoever opened them (an in-pod proxy opens its own here).
	Listeners []string `json:"listeners"`
}
