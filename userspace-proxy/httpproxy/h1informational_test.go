package httpproxy

import (
	"net/http"
	"testing"
	"time"
)

// TestBackendContinueNotBehindWrites: a backend's 100 Continue, which the
// proxy does not pass on (it sends its own as the app's body is first
// read), does not wait for the app's writer, which the request body's
// goroutine may hold for long, writing that 100 to an app that reads
// nothing (until the stall watch ends it): the exchange reads on to the
// final answer meanwhile. Before, it waited for the writer — and in a
// synctest bubble, where a wait on a mutex lets no time pass, the stall
// watch never came: the proxy's TestUnreadAnswersCut/continue hung (the
// thirty-first session's CI, 20 minutes under -race).
func TestBackendContinueNotBehindWrites(t *testing.T) {
	s := &h1Conn{wmu: make(writeTurn, 1)}
	s.wmu.take() // the body's goroutine, writing the proxy's 100
	defer s.wmu.give()
	req, _ := http.NewRequest(http.MethodPost, "http://echo/", http.NoBody)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.informational(req, &http.Response{StatusCode: http.StatusContinue, Header: http.Header{}})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a hang guard, not a timing check
		t.Fatal("a backend's 100 Continue waited for the app's writer")
	}
}
