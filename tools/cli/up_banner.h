// What `flotilla up` prints once its cluster serves: where, which model id to
// put in a request's "model", and commands that work as printed (with the
// CA, client certificate and key placeholder the cluster needs). Text for a
// person, or one JSON object under --log-format json.
#pragma once

#include <string>
#include <vector>

namespace flotilla::cli {

struct UpBanner {
  std::string model;          // checkpoint directory or synthetic spec
  std::string model_id;       // what requests give as "model"
  int workers = 1;
  std::vector<int> gpus;      // each worker's GPU; empty on the CPU
  std::string grpc_address;   // host:port
  std::string http_address;   // host:port; empty = the HTTP API is off
  bool tls = false;
  std::string tls_ca;         // the CA that verifies the coordinator (TLS)
  std::string client_cert;    // mTLS: a client certificate and key it accepts
  std::string client_key;
  bool needs_key = false;     // API keys are on: the commands carry KEY
};

// `flotilla generate` against the cluster.
std::string GrpcTryCommand(const UpBanner& b);
// curl of /v1/chat/completions (empty when HTTP is off).
std::string HttpTryCommand(const UpBanner& b);
// The lines a person reads, each ending in a newline.
std::string BannerText(const UpBanner& b);
// One JSON line with the same facts as members.
std::string BannerJson(const UpBanner& b);

}  // namespace flotilla::cli
