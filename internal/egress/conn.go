package egress

import (
	"context"
	"net"
)

// serveConn handles one client connection: a forward request or a CONNECT.
func (p *Proxy) serveConn(ctx context.Context, c net.Conn) {
	_ = ctx
	_ = c
}
