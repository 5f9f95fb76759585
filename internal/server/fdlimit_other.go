//go:build !unix

package server

import "errors"

// openFileLimit is not known on this system: client connections are not
// capped unless server.max_connections says so.
func openFileLimit() (uint64, error) {
	return 0, errors.New("no open-file limit on this system")
}
