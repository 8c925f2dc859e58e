#include "common/listen_address.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/tls_credentials.h"

namespace flotilla {
namespace {

TEST(ListenAddress, ParsesHostAndPort) {
  absl::StatusOr<ListenAddress> a = ParseListenAddress("127.0.0.1:50051", "--listen");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 50051);
  EXPECT_EQ(a->ToString(), "127.0.0.1:50051");
  a = ParseListenAddress("[::1]:0", "--listen");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 0);
  EXPECT_EQ(a->ToString(), "[::1]:0");
  EXPECT_TRUE(ParseListenAddress("0.0.0.0:65535", "--listen").ok());
}

TEST(ListenAddress, RefusesPortsOutOfRangeAndMalformedAddresses) {
  for (const char* bad :
       {"127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:", "127.0.0.1", ":50051",
        "127.0.0.1:50051x", "127.0.0.1:0x10", "::1:50051", "127.0.0.1:+80", "127.0.0.1:123456"}) {
    absl::StatusOr<ListenAddress> a = ParseListenAddress(bad, "--listen");
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(a.status().message().find("--listen"), std::string::npos) << a.status();
    EXPECT_NE(a.status().message().find(bad), std::string::npos) << a.status();
  }
}

TEST(ListenAddress, TakenPortIsAClearError) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ListenAddress taken{"127.0.0.1", port, false};
  absl::Status st = CheckPortFree(taken, "--http-listen");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find(std::to_string(port)), std::string::npos) << st;
  EXPECT_NE(st.message().find("already in use"), std::string::npos) << st;
  EXPECT_NE(st.message().find("--http-listen"), std::string::npos) << st;
  close(fd);
  EXPECT_TRUE(CheckPortFree(taken, "--http-listen").ok());
  EXPECT_TRUE(CheckPortFree(ListenAddress{"127.0.0.1", 0, false}, "--listen").ok());
  EXPECT_EQ(CheckPortFree(ListenAddress{"no-such-host.invalid", 1234, false}, "--listen").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TlsFiles, CheckedBeforeUse) {
  EXPECT_TRUE(CheckServerFiles({}).ok());
  EXPECT_TRUE(CheckClientFiles({}).ok());
  TlsServerFiles half;
  half.cert = "/nonexistent/server.crt";
  absl::Status st = CheckServerFiles(half);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--tls-key"), std::string::npos) << st;
  half.key = "/nonexistent/server.key";
  st = CheckServerFiles(half);
  EXPECT_NE(st.message().find("/nonexistent/server.crt"), std::string::npos) << st;
  const TlsServerFiles mtls_only{"", "", "/nonexistent/ca.crt"};
  EXPECT_FALSE(CheckServerFiles(mtls_only).ok());
  const TlsClientFiles cert_without_ca{"", "client.crt", "client.key"};
  st = CheckClientFiles(cert_without_ca);
  EXPECT_NE(st.message().find("--tls-ca"), std::string::npos) << st;
  const TlsClientFiles no_file{"/nonexistent/ca.crt", "", ""};
  EXPECT_FALSE(MakeChannelCredentials(no_file).ok());
  EXPECT_TRUE(MakeChannelCredentials({}).ok());
}

// gRPC reads its suites from GRPC_SSL_CIPHER_SUITES; only AEAD ones pass.
TEST(TlsFiles, GrpcCipherSuitesOnlyAead) {
  EXPECT_TRUE(CheckGrpcCipherSuites(nullptr).ok());
  EXPECT_TRUE(CheckGrpcCipherSuites("").ok());
  EXPECT_TRUE(CheckGrpcCipherSuites("ECDHE-RSA-AES128-GCM-SHA256:TLS_AES_128_GCM_SHA256").ok());
  for (const char* weak : {"ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES128-GCM-SHA256:AES128-GCM-SHA256",
                           "DHE-RSA-AES128-GCM-SHA256", "ALL", "HIGH"}) {
    const absl::Status st = CheckGrpcCipherSuites(weak);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << weak;
    EXPECT_NE(st.message().find("GRPC_SSL_CIPHER_SUITES"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace flotilla
