//go:build !unix

package submitcmd

// freeBytes cannot tell the free space here: roomFor checks nothing.
func freeBytes(string) (int64, bool) { return 0, false }
