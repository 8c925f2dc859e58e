// The worker's side of its session with the coordinator, as the rest of the
// worker sees it: messages out (never blocking on the stream), messages in,
// and the session's end. ControlSession is the gRPC implementation; tests
// drive a worker through a fake.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"

namespace flotilla::worker {

class CoordinatorClient {
 public:
  // Fills a heartbeat's load with the worker's current figures (called from
  // the client's own thread: it must only read thread-safe state).
  using LoadReporter = std::function<void(cluster::WorkerLoad*)>;
  // Called on the client's own thread with a message that must reach the
  // worker even while its engine loop is inside a step (DropGeneration), as
  // soon as it arrives and before Receive returns it; and once when the
  // session ends, with DropGeneration{generation 0}: the peers of whatever
  // runs are leaving too, so no collective should wait for them.
  using UrgentHandler = std::function<void(const cluster::CoordinatorMessage&)>;

  virtual ~CoordinatorClient() = default;

  // Reaches the coordinator (UNAVAILABLE when it cannot within the connect
  // timeout, or once Close was called). Called once, before Open; a client
  // serves one session (the worker makes a new one to reconnect).
  virtual absl::Status Connect() = 0;
  // Opens the session: sends `hello` first, then heartbeats every interval
  // the coordinator asks for, with the load `report` fills in; `urgent` sees
  // DropGeneration messages first.
  virtual absl::Status Open(cluster::WorkerMessage hello, LoadReporter report,
                            UrgentHandler urgent) = 0;
  // Queues `message` for the coordinator, in order; never blocks on the stream.
  virtual void Send(cluster::WorkerMessage message) = 0;
  // Queues a heartbeat with the load `report` fills in now, in order with
  // Send and with the periodic heartbeats (none filled in before it is
  // queued after it), for a change the coordinator should see at once.
  virtual void ReportLoadNow() = 0;
  // The coordinator's messages received since the last call, waiting up to
  // `wait` for one when there are none (less when the session ends).
  virtual std::vector<cluster::CoordinatorMessage> Receive(absl::Duration wait) = 0;
  // Whether the session has ended (the coordinator closed it, or Close).
  virtual bool Ended() const = 0;
  // Ends the session from this side; safe from any thread, at any time.
  virtual void Close() = 0;
  // After Close: sends what is queued, waits for the session's threads and
  // returns why the session ended (OK when this side closed it).
  virtual absl::Status Finish() = 0;
};

}  // namespace flotilla::worker
