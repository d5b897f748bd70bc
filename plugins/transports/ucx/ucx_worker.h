// The UCP plumbing of the ucx transport: one context, one worker, one progress thread that owns
// it, and one dispatch thread that hands what arrived to the transport. Other threads send under
// the worker's mutex and wake the progress thread (ucp_worker_signal).
//
// Lock order: the worker's mutex, then the transport's. SendDone callbacks run on the progress
// thread with the worker's mutex held: they may take the transport's mutex but must not call the
// worker. Events (messages, peers gone) are delivered on the dispatch thread with no lock held, so
// a handler may send, block on a send window or do disk I/O without stalling the progress thread.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "refit/kernels/buffer.h"
#include "refit/status.h"
#include "ucx_wire.h"

namespace refit::ucx {

using ConnId = uint64_t;
// Message bodies: never zero-filled, large ones on huge pages and reused once freed. A full
// sync's payloads are a bucket each; fresh, each buffer's pages were faulted in and zeroed by the
// kernel before the copy into them (docs/benchmarks.md, "Full sync over ucx").
using Buffer = kernels::ReusedVector<uint8_t>;
using Bytes = std::shared_ptr<const Buffer>;
using SendDone = std::function<void(const Status&)>;

struct Event {
  enum class Kind { kMessage, kPeerDown };
  Kind kind = Kind::kMessage;
  ConnId conn = 0;
  MsgHeader header;
  Buffer data;
  std::string why;  // kPeerDown: the reason
};

class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual void OnEvent(Event event) = 0;
};

// "host:port" split; the host resolved to an IPv4 address.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
Result<HostPort> ParseHostPort(const std::string& text, const std::string& what);

struct WorkerOptions {
  std::string tls = "tcp";  // UCX_TLS of this context (ucp_config_modify), "" keeps UCX's default
  // A peer with sends pending and none completed for this long is dropped (a hung receiver).
  std::chrono::milliseconds send_timeout{30000};
};

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> Start(const WorkerOptions& options, EventHandler* handler);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Accepts connections on addr (port 0: any free one); the address actually bound.
  Result<HostPort> Listen(const HostPort& addr);
  // An endpoint to addr; the connection is made in the background (a refused one is a kPeerDown).
  Result<ConnId> Connect(const HostPort& addr);
  // Sends one message (data may be null: no data). done runs once the send completed or failed,
  // unless Send itself fails (then it never runs). Not-yet-completed sends hold `data`.
  Status Send(ConnId conn, const MsgHeader& header, Bytes data, SendDone done);
  // Drops a connection now (pending sends fail); a kPeerDown event follows unless it was gone.
  void Close(ConnId conn, const std::string& why);
  // Waits until no send is pending or the deadline passes; false on timeout.
  bool Flush(std::chrono::milliseconds timeout);
  std::string PeerName(ConnId conn);
  // The UCX transports (lanes) of conn's endpoint, one "<tl>/<device>" per lane: which of
  // `tls` a connection really uses (debug log).
  std::string Lanes(ConnId conn);
  // Joins the progress and dispatch threads (idempotent): after it no event is delivered, so
  // the handler may go away. The destructor calls it.
  void Stop();

 private:
  struct Conn;
  struct SendCtx;
  struct RecvCtx;
  struct WireCtx;
  explicit Worker(EventHandler* handler);
  Status Init(const WorkerOptions& options);
  void ProgressLoop();
  void DispatchLoop();
  void AfterProgress();
  void CheckTimeouts();
  void MarkDown(ConnId conn, const std::string& why);
  void Deliver(Event event);
  ConnId AddConn(ucp_ep_h ep, const std::string& name);
  Status CreateEp(ucp_ep_params_t* params, const std::string& name, ConnId* out);
  void CloseAll();
  void AwaitWired(Conn& conn);
  Status Post(Conn& c, std::unique_ptr<SendCtx>& ctx);
  void ReleaseHeld(ConnId id);
  static void OnWired(void* request, ucs_status_t status, void* user_data);
  void AwaitBounded(ucs_status_ptr_t req, int seconds);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  void StartRndv(RecvCtx* ctx, void* desc);

  EventHandler* handler_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int efd_ = -1;
  std::chrono::milliseconds send_timeout_{30000};

  std::mutex mu_;  // every ucp_* call on worker_ and its endpoints, and the fields below
  std::map<ConnId, std::unique_ptr<Conn>> conns_;
  std::map<ucp_ep_h, ConnId> by_ep_;
  ConnId next_conn_ = 1;
  std::vector<ucp_conn_request_h> accepted_;
  std::vector<std::pair<RecvCtx*, void*>> rndv_;
  std::vector<ConnId> to_close_;
  std::vector<ConnId> wired_;  // connections we made whose wiring flush completed
  uint64_t pending_sends_ = 0;
  std::condition_variable flushed_;
  bool stop_ = false;

  std::mutex events_mu_;
  std::condition_variable events_cv_;
  std::deque<Event> events_;
  bool events_stop_ = false;

  std::thread progress_;
  std::thread dispatch_;
};

}  // namespace refit::ucx
