package harnesses

import (
	"slices"
	"testing"
)

// The network watch must tell the router's loopback from a DNS query or a connection elsewhere,
// over IPv4 and IPv6: strace lines as it writes them.
func TestNetworkWatchFlagsEveryAddressOffTheLoopback(t *testing.T) {
	trace := []byte(`101 connect(37, {sa_family=AF_INET, sin_port=htons(30000), sin_addr=inet_addr("127.0.0.1")}, 16) = -1 EINPROGRESS (Operation now in progress)
102 connect(7, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16) = 0
103 sendto(38, "\242\353\1\0\0\1", 32, MSG_NOSIGNAL, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("192.168.1.1")}, 16) = 32
104 connect(9, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2606:4700::6810:84e5", &sin6_addr), sin6_scope_id=0}, 28) = 0
105 connect(9, {sa_family=AF_INET6, sin6_port=htons(30000), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0
106 connect(9, {sa_family=AF_INET6, sin6_port=htons(30000), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6_addr), sin6_scope_id=0}, 28) = 0
107 connect(5, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT (No such file or directory)
108 sendto(6, "\1", 1, MSG_NOSIGNAL, NULL, 0) = 1
`)
	loopback, others := tracedAddresses(trace)
	if loopback != 3 {
		t.Errorf("%d loopback addresses, want 3 (127.0.0.1, ::1, ::ffff:127.0.0.1)", loopback)
	}
	var ids []string
	for _, line := range others {
		ids = append(ids, line[:3])
	}
	if !slices.Equal(ids, []string{"102", "103", "104"}) {
		t.Errorf("flagged lines %v, want the resolver, the LAN address and the IPv6 host: 102 103 104", ids)
	}
}
