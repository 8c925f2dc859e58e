// Bounds on what a worker writes to its coordinator session. One message over
// the gRPC limit would end the session (and the worker with it), so large
// payloads go out in bounded pieces and Send splits anything still too big.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <functional>

#include "proto/cluster.pb.h"

namespace flotilla::worker {

// The largest message a worker sends (both ends allow 256 MiB; this leaves
// room and keeps one message from holding the stream for long).
inline constexpr size_t kMaxWorkerMessageBytes = size_t{16} << 20;
// The session writes larger messages in parts of about this size (a prompt-
// logits chunk and framing): the coordinator takes every message it receives
// as a sign of life, and over a loaded machine a 16 MiB message can take
// longer to cross than the heartbeat timeout; one part of this size does not.
inline constexpr size_t kSessionPartBytes = (size_t{5} << 20) / 2;
// The most prompt-logits bytes one SequenceUpdate carries: whole rows, at
// least one. The coordinator forwards each as one client message, which stays
// under the 4 MiB default receive limit of gRPC clients for vocabularies up
// to a million.
inline constexpr size_t kPromptLogitsChunkBytes = size_t{2} << 20;

// Appends to `batch` the prompt-logits rows `logits` ([rows, vocab]) of
// `request_id`, in order, as updates of whole rows of at most
// kPromptLogitsChunkBytes each (one row when a row alone is larger).
void AppendPromptLogits(uint64_t request_id, const std::vector<float>& logits, int64_t vocab,
                        cluster::TokenBatch* batch);

// `message` as messages of at most `max_bytes`: a TokenBatch's updates are
// spread over batches of the same step, in order; an update that alone is
// larger becomes an error update of its request (RESOURCE_EXHAUSTED), so no
// request can break the session. Other kinds come back as they are.
std::vector<cluster::WorkerMessage> SplitWorkerMessage(const cluster::WorkerMessage& message,
                                                       size_t max_bytes);
// The same parts, each handed to `write` as soon as it is complete, so the
// first goes out before the rest of a large message is copied.
void ForEachWorkerMessagePart(const cluster::WorkerMessage& message, size_t max_bytes,
                              const std::function<void(const cluster::WorkerMessage&)>& write);

}  // namespace flotilla::worker
