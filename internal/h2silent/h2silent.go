// Package h2silent is a test backend for HTTP/2 liveness checks: a peer
// that answers its client's first request and then falls silent — reads
// everything, acknowledges nothing, PINGs included — as a backend whose
// node vanished looks from the client's side while TCP still holds.
package h2silent

import (
	"bufio"
	"bytes"
	"io"
	"net"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Serve speaks HTTP/2 on c, a connection accepted from a client: it
// announces extended CONNECT (RFC 8441) in its SETTINGS, answers the
// first request's HEADERS with a 200 (which opens a WebSocket), then
// reads c to its end without a word. It returns when c fails or ends; the
// caller closes c.
func Serve(c net.Conn) {
	br := bufio.NewReader(c)
	fr := http2.NewFramer(c, br)
	if _, err := br.Discard(len(http2.ClientPreface)); err != nil ||
		fr.WriteSettings(http2.Setting{ID: http2.SettingEnableConnectProtocol, Val: 1}) != nil {
		return
	}
	var block bytes.Buffer
	hpack.NewEncoder(&block).WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		if h, ok := f.(*http2.HeadersFrame); ok {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.StreamID, BlockFragment: block.Bytes(), EndHeaders: true})
			break
		}
	}
	io.Copy(io.Discard, br)
}
