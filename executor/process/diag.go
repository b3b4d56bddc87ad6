package process

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// diagListeners asks the kernel (netlink sock_diag) for the TCP sockets
// listening on port, on loopback or every address, and returns their
// inodes. Unlike /proc/net/tcp, the kernel sends only listening sockets,
// so the time taken does not grow with the node's connections.
func diagListeners(port int) ([]uint64, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 2}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	var out []uint64
	for seq, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if err := diagRequest(fd, uint32(seq+1), family, port); err != nil {
			return nil, err
		}
		inodes, err := diagRead(fd, uint32(seq+1), port)
		if err != nil {
			return nil, err
		}
		out = append(out, inodes...)
	}
	return out, nil
}

const (
	nlmsgHdrLen  = 16
	diagReqLen   = 56 // struct inet_diag_req_v2
	diagMsgLen   = 72 // struct inet_diag_msg
	tcpListen    = 10
	sockDiagByFa = 20 // SOCK_DIAG_BY_FAMILY
)

func diagRequest(fd int, seq uint32, family uint8, port int) error {
	b := make([]byte, nlmsgHdrLen+diagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], sockDiagByFa)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], seq)
	r := b[nlmsgHdrLen:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 1<<tcpListen)
	binary.BigEndian.PutUint16(r[8:], uint16(port)) // id.sport: a hint, checked below
	return unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

func diagRead(fd int, seq uint32, port int) ([]uint64, error) {
	var out []uint64
	buf := make([]byte, 64<<10)
	ne := binary.NativeEndian
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag: %w", err)
		}
		b := buf[:n]
		for len(b) >= nlmsgHdrLen {
			l := int(ne.Uint32(b[0:]))
			typ := ne.Uint16(b[4:])
			if l < nlmsgHdrLen || l > len(b) {
				return nil, errors.New("sock_diag: a message longer than its datagram")
			}
			msg := b[nlmsgHdrLen:l]
			b = b[min((l+3)&^3, len(b)):]
			switch typ {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(msg) >= 4 {
					if e := int32(ne.Uint32(msg)); e != 0 {
						return nil, fmt.Errorf("sock_diag: %w", unix.Errno(-e))
					}
				}
				return out, nil
			}
			if len(msg) < diagMsgLen {
				continue
			}
			family, state := msg[0], msg[1]
			sport := int(binary.BigEndian.Uint16(msg[4:]))
			src := msg[8:24]
			inode := uint64(ne.Uint32(msg[68:]))
			if state == tcpListen && sport == port && inode != 0 && loopbackOrAny(family, src) {
				out = append(out, inode)
			}
		}
	}
}

// loopbackOrAny: the agent connects to 127.0.0.1 or ::1, which reaches a
// socket bound there or to every address.
func loopbackOrAny(family uint8, a []byte) bool {
	zero := func(b []byte) bool {
		for _, x := range b {
			if x != 0 {
				return false
			}
		}
		return true
	}
	switch family {
	case unix.AF_INET:
		return zero(a[:4]) || (a[0] == 127 && a[1] == 0 && a[2] == 0 && a[3] == 1)
	case unix.AF_INET6:
		if zero(a[:16]) || (zero(a[:15]) && a[15] == 1) {
			return true
		}
		if zero(a[:10]) && a[10] == 0xff && a[11] == 0xff {
			return zero(a[12:16]) || (a[12] == 127 && a[13] == 0 && a[14] == 0 && a[15] == 1)
		}
	}
	return false
}
