//go:build unix

package server

import "syscall"

// openFileLimit returns the process's limit on open files (the soft
// RLIMIT_NOFILE, which the Go runtime raises to the hard limit at start).
func openFileLimit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	return uint64(rl.Cur), nil
}
