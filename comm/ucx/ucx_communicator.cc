#include "comm/ucx/ucx_communicator.h"

#include <sched.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace flotilla::comm {
namespace {

// Bootstrap envelope: magic, then the UCX address length (8 bytes, little
// endian), then the address. Lets Create reject bytes that are not an address
// instead of handing them to UCX.
constexpr char kMagic[8] = {'F', 'L', 'U', 'C', 'X', '1', 0, 0};
constexpr size_t kHeader = sizeof(kMagic) + 8;
// Bits of the UCX tag below the collective's tag that name the sender.
constexpr int kSourceBits = 16;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

// SipHash-2-4 (Aumasson and Bernstein) of the two words (m0, m1), keyed by
// key[0..1]: a keyed tag that nobody without the key can produce.
uint64_t SipHash24(const uint64_t key[2], uint64_t m0, uint64_t m1) {
  uint64_t v0 = key[0] ^ 0x736f6d6570736575ull, v1 = key[1] ^ 0x646f72616e646f6dull;
  uint64_t v2 = key[0] ^ 0x6c7967656e657261ull, v3 = key[1] ^ 0x7465646279746573ull;
  auto round = [&] {
    v0 += v1; v1 = Rotl(v1, 13); v1 ^= v0; v0 = Rotl(v0, 32);
    v2 += v3; v3 = Rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = Rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = Rotl(v1, 17); v1 ^= v2; v2 = Rotl(v2, 32);
  };
  const uint64_t last = uint64_t{16} << 56;  // message length 16 bytes, no tail
  for (uint64_t m : {m0, m1, last}) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

// Mixes a key word longer secrets fold into (one SipHash of it under a zero key).
uint64_t SipRound64(uint64_t word) {
  const uint64_t zero[2] = {0, 0};
  return SipHash24(zero, word, 0);
}
// recv_status_ value of a receive whose outcome was already looked at (not a
// ucs_status_t value).
constexpr int kChecked = 2;

std::string UcsError(ucs_status_t st) { return ucs_status_string(st); }

absl::Status UcxError(absl::string_view what, ucs_status_t st) {
  return absl::InternalError(absl::StrCat(what, ": ", UcsError(st)));
}

void OnPeerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  *static_cast<int*>(arg) = static_cast<int>(status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status);
}

absl::StatusOr<std::string_view> OpenEnvelope(const std::string& bytes, int rank) {
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("UcxCommunicator: the bootstrap bytes of rank ",
                                                   rank, " are not a UcxWorker::Address() (",
                                                   bytes.size(), " bytes, bad header)"));
  }
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) {
    len = (len << 8) | static_cast<uint8_t>(bytes[sizeof(kMagic) + static_cast<size_t>(i)]);
  }
  if (len == 0 || len != bytes.size() - kHeader) {
    return absl::InvalidArgumentError(absl::StrCat("UcxCommunicator: the bootstrap bytes of rank ",
                                                   rank, " are truncated or padded (header says ",
                                                   len, " address bytes, ", bytes.size() - kHeader,
                                                   " present)"));
  }
  return std::string_view(bytes).substr(kHeader);
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError("ucp_config_read", st);
  for (const auto& [name, value] : options.config_defaults) {
    const std::string env = "UCX_" + name;
    if (std::getenv(env.c_str()) != nullptr) continue;  // the environment wins
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("UCX setting ", name, "=", value, " rejected: ", UcsError(st)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  st = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcxError("ucp_init", st);

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(w->context_, &wp, &w->worker_);
  if (st != UCS_OK) return UcxError("ucp_worker_create", st);

  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(w->worker_, &addr, &len);
  if (st != UCS_OK) return UcxError("ucp_worker_get_address", st);
  w->address_.assign(kMagic, sizeof(kMagic));
  for (int i = 0; i < 8; ++i)
    w->address_.push_back(static_cast<char>((uint64_t{len} >> (8 * i)) & 0xff));
  w->address_.append(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w->worker_, addr);
  return w;
}

UcxWorker::~UcxWorker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

UcxCommunicator::UcxCommunicator(std::unique_ptr<UcxWorker> worker, int rank, int size,
                                 const UcxOptions& options)
    : P2pCommunicator(rank, size),
      worker_(std::move(worker)),
      options_(options),
      eps_(static_cast<size_t>(size), nullptr),
      peer_failure_(new int[static_cast<size_t>(size)]()) {
  if (!options_.peer_secret.empty()) {
    // The secret's bytes folded into a 128-bit key (a random secret of 16+
    // bytes keeps its entropy).
    const std::string& secret = options_.peer_secret;
    for (size_t i = 0; i < secret.size(); ++i) {
      uint64_t& word = tag_key_[(i / 8) % 2];
      word ^= static_cast<uint64_t>(static_cast<unsigned char>(secret[i])) << (8 * (i % 8));
      if (i >= 16) word = SipRound64(word);
    }
    keyed_tags_ = true;
  }
}

uint64_t UcxCommunicator::WireTag(uint64_t tag, int source) const {
  if (!keyed_tags_) return (tag << kSourceBits) | static_cast<uint64_t>(source);
  return SipHash24(tag_key_, tag, static_cast<uint64_t>(source));
}

absl::StatusOr<std::unique_ptr<UcxCommunicator>> UcxCommunicator::Create(
    std::unique_ptr<UcxWorker> worker, int rank, const std::vector<std::string>& addresses,
    const UcxOptions& options) {
  if (worker == nullptr) return absl::InvalidArgumentError("UcxCommunicator: no worker");
  const int size = static_cast<int>(addresses.size());
  if (size < 1) return absl::InvalidArgumentError("UcxCommunicator: no addresses");
  if (size >= (1 << kSourceBits)) {
    return absl::InvalidArgumentError(absl::StrCat("UcxCommunicator: ", size, " ranks; at most ",
                                                   (1 << kSourceBits) - 1, " are supported"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("UcxCommunicator: rank ", rank, " is outside a group of ", size));
  }
  if (addresses[static_cast<size_t>(rank)] != worker->Address()) {
    return absl::InvalidArgumentError(
        absl::StrCat("UcxCommunicator: addresses[", rank, "] is not this worker's own address"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("UcxCommunicator: timeout must be positive");
  }
  std::vector<std::string_view> raw(static_cast<size_t>(size));
  for (int p = 0; p < size; ++p) {
    FLOTILLA_ASSIGN_OR_RETURN(raw[static_cast<size_t>(p)],
                              OpenEnvelope(addresses[static_cast<size_t>(p)], p));
  }
  std::unique_ptr<UcxCommunicator> c(new UcxCommunicator(std::move(worker), rank, size, options));
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(raw[static_cast<size_t>(p)].data());
    if (options.detect_peer_failure) {
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &OnPeerError;
      ep.err_handler.arg = &c->peer_failure_[static_cast<size_t>(p)];
    }
    ucs_status_t st = ucp_ep_create(c->worker_->worker_, &ep, &c->eps_[static_cast<size_t>(p)]);
    if (st != UCS_OK) {
      return absl::UnavailableError(
          absl::StrCat("UcxCommunicator: cannot reach rank ", p, ": ", UcsError(st)));
    }
  }
  // Every connection is wired up (and every peer known to be alive) before
  // the first real collective.
  absl::Status st = c->Barrier(nullptr);
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("UcxCommunicator: group did not form: ", st.message()));
  }
  return c;
}

bool UcxCommunicator::ProgressUntilDone(void* request, absl::Time deadline) {
  uint64_t iter = 0;
  while (ucp_request_check_status(request) == UCS_INPROGRESS) {
    ucp_worker_progress(worker_->worker_);
    if ((++iter & 255) == 0 && absl::Now() > deadline) return false;
  }
  return true;
}

void UcxCommunicator::Abort() {
  if (aborted_) return;
  aborted_ = true;
  ucp_worker_h w = worker_->worker_;
  for (void*& r : recv_requests_) {
    if (r != nullptr) ucp_request_cancel(w, r);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  for (ucp_ep_h& ep : eps_) {
    if (ep == nullptr) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) {
      ProgressUntilDone(r, deadline);
      ucp_request_free(r);
    }
    ep = nullptr;
  }
  for (auto* list : {&send_requests_, &recv_requests_}) {
    for (void*& r : *list) {
      if (r != nullptr) {
        ProgressUntilDone(r, deadline);
        ucp_request_free(r);
        r = nullptr;
      }
    }
  }
}

UcxCommunicator::~UcxCommunicator() {
  if (!aborted_) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    ucp_request_param_t fp{};
    void* r = ucp_worker_flush_nbx(worker_->worker_, &fp);
    if (UCS_PTR_IS_PTR(r)) {
      ProgressUntilDone(r, deadline);
      ucp_request_free(r);
    }
    for (ucp_ep_h& ep : eps_) {
      if (ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags =
          peer_failure_[static_cast<size_t>(&ep - eps_.data())] != 0 ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      void* c = ucp_ep_close_nbx(ep, &p);
      if (UCS_PTR_IS_PTR(c)) {
        ProgressUntilDone(c, deadline);
        ucp_request_free(c);
      }
      ep = nullptr;
    }
  }
}

std::string UcxCommunicator::TransportInfo(int peer) const {
  if (peer < 0 || peer >= size() || eps_[static_cast<size_t>(peer)] == nullptr) return "";
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return "";
  ucp_ep_print_info(eps_[static_cast<size_t>(peer)], f);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

absl::Status UcxCommunicator::Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                                       absl::Span<const RecvOp> recvs) {
  if (aborted_) return absl::UnavailableError("UcxCommunicator: connections are closed");
  static char empty_byte = 0;
  ucp_worker_h w = worker_->worker_;
  recv_requests_.assign(recvs.size(), nullptr);
  recv_lengths_.assign(recvs.size(), 0);
  recv_status_.assign(recvs.size(), UCS_INPROGRESS);
  send_requests_.assign(sends.size(), nullptr);
  absl::Status failure;

  // Receives first, so most messages land directly in the user's buffer.
  for (size_t i = 0; i < recvs.size(); ++i) {
    const RecvOp& r = recvs[i];
    // No immediate completion: UCX 1.13 does not fill recv_info when a
    // receive completes inside the call, and the length must be checked.
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* req = ucp_tag_recv_nbx(w, r.bytes > 0 ? r.data : &empty_byte, r.bytes,
                                 WireTag(tag, r.peer), kFullMask, &p);
    if (UCS_PTR_IS_ERR(req)) {
      recv_status_[i] = UCS_PTR_STATUS(req);
    } else {
      recv_requests_[i] = req;
    }
  }
  const ucp_tag_t my_tag = WireTag(tag, rank());
  for (size_t i = 0; i < sends.size(); ++i) {
    const SendOp& s = sends[i];
    ucp_request_param_t p{};
    void* req = ucp_tag_send_nbx(eps_[static_cast<size_t>(s.peer)],
                                 s.bytes > 0 ? s.data : &empty_byte, s.bytes, my_tag, &p);
    if (UCS_PTR_IS_ERR(req)) {
      failure = absl::UnavailableError(absl::StrCat("rank ", rank(), ": sending to rank ", s.peer,
                                                    " failed: ", UcsError(UCS_PTR_STATUS(req))));
      break;
    }
    send_requests_[i] = req;
  }

  // Progress until every request is done, a peer fails, or the timeout passes.
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.timeout;
  uint64_t iter = 0;
  while (failure.ok()) {
    if (options_.interrupt && options_.interrupt->load(std::memory_order_relaxed)) {
      failure = absl::UnavailableError(
          absl::StrCat("rank ", rank(), ": interrupted: a peer of this group is gone"));
      break;
    }
    bool pending = false;
    for (size_t i = 0; i < sends.size(); ++i) {
      void*& req = send_requests_[i];
      if (req == nullptr) continue;
      ucs_status_t st = ucp_request_check_status(req);
      if (st == UCS_INPROGRESS) {
        pending = true;
        continue;
      }
      ucp_request_free(req);
      req = nullptr;
      if (st != UCS_OK) {
        failure = absl::UnavailableError(absl::StrCat("rank ", rank(), ": sending to rank ",
                                                      sends[i].peer, " failed: ", UcsError(st)));
      }
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      void*& req = recv_requests_[i];
      if (req != nullptr) {
        ucp_tag_recv_info_t info{};
        ucs_status_t st = ucp_tag_recv_request_test(req, &info);
        if (st == UCS_INPROGRESS) {
          pending = true;
          if (peer_failure_[static_cast<size_t>(recvs[i].peer)] != 0) {
            failure = absl::UnavailableError(absl::StrCat(
                "rank ", rank(), ": peer rank ", recvs[i].peer, " failed: ",
                UcsError(
                    static_cast<ucs_status_t>(peer_failure_[static_cast<size_t>(recvs[i].peer)]))));
          }
          continue;
        }
        ucp_request_free(req);
        req = nullptr;
        recv_status_[i] = st;
        recv_lengths_[i] = info.length;
      }
      const int st = recv_status_[i];
      if (st == UCS_INPROGRESS || st == kChecked) continue;
      recv_status_[i] = kChecked;
      if (st == UCS_ERR_MESSAGE_TRUNCATED) {
        failure = absl::InvalidArgumentError(absl::StrCat("rank ", rank(), ": rank ", recvs[i].peer,
                                                          " sent more than the ", recvs[i].bytes,
                                                          " bytes expected"));
      } else if (st != UCS_OK) {
        failure = absl::UnavailableError(
            absl::StrCat("rank ", rank(), ": receiving from rank ", recvs[i].peer,
                         " failed: ", UcsError(static_cast<ucs_status_t>(st))));
      } else if (recv_lengths_[i] != recvs[i].bytes) {
        failure = absl::InvalidArgumentError(
            absl::StrCat("rank ", rank(), ": rank ", recvs[i].peer, " sent ", recv_lengths_[i],
                         " bytes where ", recvs[i].bytes, " were expected"));
      }
    }
    if (!pending || !failure.ok()) break;
    ucp_worker_progress(w);
    if ((++iter & 63) == 0) {
      const absl::Time now = absl::Now();
      if (now > deadline) {
        std::vector<int> silent;
        for (size_t i = 0; i < recvs.size(); ++i) {
          if (recv_requests_[i] != nullptr) silent.push_back(recvs[i].peer);
        }
        failure = absl::UnavailableError(absl::StrCat("rank ", rank(), ": no message from rank(s) ",
                                                      absl::StrJoin(silent, ","), " within ",
                                                      absl::FormatDuration(options_.timeout)));
        break;
      }
      // Past the spin period, give the CPU to others (ranks may share cores),
      // and sleep briefly once the wait is long.
      const absl::Duration waited = now - start;
      if (waited > absl::Milliseconds(20)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (waited > options_.spin) {
        sched_yield();
      }
    }
  }
  if (!failure.ok()) Abort();
  return failure;
}

}  // namespace flotilla::comm
