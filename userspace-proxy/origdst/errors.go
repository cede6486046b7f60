package origdst

import "errors"

// ErrNotRedirected means the kernel recorded no original destination for the
// connection: it reached the listener without being redirected.
var ErrNotRedirected = errors.New("no original destination recorded")
