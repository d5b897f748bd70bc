#include "ucx_worker.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "refit/sdk/plugin.hpp"

namespace refit::ucx {
namespace {

using Clock = std::chrono::steady_clock;

Status UcsError(const std::string& what, ucs_status_t st) {
  return Status::IoError("ucx transport: " + what + ": " + ucs_status_string(st));
}

sockaddr_in ToSockaddr(const HostPort& addr) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(addr.port);
  ::inet_pton(AF_INET, addr.host.c_str(), &sin.sin_addr);
  return sin;
}

// "ip:port" of a connecting client, for log lines.
std::string ClientAddress(ucp_conn_request_h request) {
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) != UCS_OK ||
      attr.client_address.ss_family != AF_INET) {
    return "a client";
  }
  const auto* sin = reinterpret_cast<const sockaddr_in*>(&attr.client_address);
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sin->sin_port));
}

// Whether a UCX_TLS list may open a shared-memory transport (UCX warns about a setting of one
// it never opened).
bool UsesSharedMemory(const std::string& tls) {
  if (tls.empty() || tls == "all") return true;
  size_t start = 0;
  while (start <= tls.size()) {
    size_t end = tls.find(',', start);
    if (end == std::string::npos) end = tls.size();
    const std::string tl = tls.substr(start, end - start);
    if (tl == "posix" || tl == "sysv" || tl == "sm" || tl == "shm" || tl == "mm" || tl[0] == '^') {
      return true;
    }
    start = end + 1;
  }
  return false;
}

void FreeRequest(ucs_status_ptr_t req) {
  if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
}

}  // namespace

struct Worker::SendCtx {
  Worker* worker = nullptr;
  ConnId conn = 0;
  std::string header;  // kept until completion: UCP may still read it
  Bytes data;
  SendDone done;
};

struct Worker::Conn {
  Worker* worker = nullptr;
  ConnId id = 0;
  ucp_ep_h ep = nullptr;
  bool dead = false;
  // A connection we made is wired up once the flush posted at its creation completed. UCX 1.13
  // fails some sends posted before that with "Invalid parameter" (seen with posix,tcp): they
  // wait in `held` until then, in order.
  bool wired = true;
  std::vector<std::unique_ptr<SendCtx>> held;
  std::string name;
  uint64_t pending = 0;  // sends not yet completed (held ones included)
  Clock::time_point last_progress = Clock::now();
};

// The flush that tells a connection we made is wired up.
struct Worker::WireCtx {
  Worker* worker = nullptr;
  ConnId conn = 0;
};

struct Worker::RecvCtx {
  Worker* worker = nullptr;
  ConnId conn = 0;
  MsgHeader header;
  Buffer data;
};

Result<HostPort> ParseHostPort(const std::string& text, const std::string& what) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size() ||
      colon + 6 < text.size()) {
    return Status::Invalid("ucx transport: " + what + " '" + text + "' is not \"host:port\"");
  }
  HostPort out;
  uint32_t port = 0;
  for (size_t i = colon + 1; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') {
      return Status::Invalid("ucx transport: " + what + " '" + text + "': port is not a number");
    }
    port = port * 10 + static_cast<uint32_t>(text[i] - '0');
  }
  if (port > 65535)
    return Status::Invalid("ucx transport: " + what + " '" + text + "': port > 65535");
  out.port = static_cast<uint16_t>(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  const std::string host = text.substr(0, colon);
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    return Status::Invalid("ucx transport: " + what + " '" + text + "': cannot resolve '" + host +
                           "' to an IPv4 address");
  }
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, buf, sizeof buf);
  ::freeaddrinfo(found);
  out.host = buf;
  return out;
}

Worker::Worker(EventHandler* handler) : handler_(handler) {}

Result<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options, EventHandler* handler) {
  std::unique_ptr<Worker> w(new Worker(handler));
  REFIT_RETURN_NOT_OK(w->Init(options));
  w->progress_ = std::thread(&Worker::ProgressLoop, w.get());
  w->dispatch_ = std::thread(&Worker::DispatchLoop, w.get());
  return w;
}

Status Worker::Init(const WorkerOptions& options) {
  send_timeout_ = options.send_timeout;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcsError("ucp_config_read", st);
  if (!options.tls.empty()) st = ucp_config_modify(config, "TLS", options.tls.c_str());
  // UCX leaves shared memory out of endpoints that ask for peer-failure handling (ours do)
  // unless told it may use it there; without this "posix,tcp" would run over tcp only. Best
  // effort: a UCX without the setting keeps its default.
  if (st == UCS_OK && UsesSharedMemory(options.tls)) {
    (void)ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
  }
  if (st != UCS_OK) {
    ucp_config_release(config);
    return Status::Invalid("ucx transport: tls = \"" + options.tls +
                           "\": " + ucs_status_string(st));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    return Status::Invalid("ucx transport: cannot initialize UCX with tls = \"" + options.tls +
                           "\": " + ucs_status_string(st));
  }
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return UcsError("ucp_worker_create (tls = \"" + options.tls + "\")", st);
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return UcsError("ucp_worker_get_efd", st);
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &Worker::OnAm;
  am.arg = this;
  st = ucp_worker_set_am_recv_handler(worker_, &am);
  if (st != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", st);
  return Status::OK();
}

Worker::~Worker() {
  Stop();
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  if (worker_ != nullptr) {
    CloseAll();
    ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucp_cleanup(context_);
}

void Worker::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    if (worker_ != nullptr) ucp_worker_signal(worker_);
  }
  {
    std::lock_guard<std::mutex> lk(events_mu_);
    events_stop_ = true;
  }
  events_cv_.notify_all();
  if (progress_.joinable()) progress_.join();
  if (dispatch_.joinable()) dispatch_.join();
}

// Progresses the worker until `req` completes or `seconds` pass, then frees it.
void Worker::AwaitBounded(ucs_status_ptr_t req, int seconds) {
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
         Clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  FreeRequest(req);
}

// What was sent is flushed first (bounded: a peer that is gone cannot hold up the exit of this
// process), then each endpoint is closed by force: that also cancels what is still posted on it
// (a receive of a rendezvous push whose sender went away); UCX 1.13 aborts when a worker is
// destroyed with such requests on an endpoint, even after a graceful close (seen with several
// instances in one process, `refit bench e2e --transport ucx`).
void Worker::CloseAll() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [id, conn] : conns_) {
    if (conn->ep == nullptr) continue;
    ucp_request_param_t p{};
    if (!conn->dead) AwaitBounded(ucp_ep_flush_nbx(conn->ep, &p), 2);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    AwaitBounded(ucp_ep_close_nbx(conn->ep, &p), 2);
    conn->ep = nullptr;
  }
  by_ep_.clear();
}

Result<HostPort> Worker::Listen(const HostPort& addr) {
  sockaddr_in sin = ToSockaddr(addr);
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sin);
  params.sockaddr.addrlen = sizeof(sin);
  params.conn_handler.cb = &Worker::OnConnRequest;
  params.conn_handler.arg = this;
  std::lock_guard<std::mutex> lk(mu_);
  ucs_status_t st = ucp_listener_create(worker_, &params, &listener_);
  if (st != UCS_OK) {
    listener_ = nullptr;
    return UcsError("cannot listen on " + addr.host + ":" + std::to_string(addr.port), st);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &attr);
  if (st != UCS_OK) return UcsError("ucp_listener_query", st);
  HostPort bound = addr;
  bound.port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  ucp_worker_signal(worker_);
  return bound;
}

ConnId Worker::AddConn(ucp_ep_h ep, const std::string& name) {
  (void)ep;
  auto conn = std::make_unique<Conn>();
  conn->worker = this;
  conn->id = next_conn_++;
  conn->name = name;
  const ConnId id = conn->id;
  conns_[id] = std::move(conn);
  return id;
}

// Creates the endpoint of a new Conn (mu_ held); the Conn is the error handler's argument.
Status Worker::CreateEp(ucp_ep_params_t* params, const std::string& name, ConnId* out) {
  const ConnId id = AddConn(nullptr, name);
  Conn* conn = conns_[id].get();
  params->field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params->err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params->err_handler.cb = &Worker::OnEpError;
  params->err_handler.arg = conn;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(worker_, params, &ep);
  if (st != UCS_OK) {
    conn->dead = true;
    return UcsError("cannot create an endpoint to " + name, st);
  }
  conn->ep = ep;
  by_ep_[ep] = id;
  *out = id;
  return Status::OK();
}

Result<ConnId> Worker::Connect(const HostPort& addr) {
  sockaddr_in sin = ToSockaddr(addr);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sin);
  params.sockaddr.addrlen = sizeof(sin);
  std::lock_guard<std::mutex> lk(mu_);
  ConnId id = 0;
  REFIT_RETURN_NOT_OK(CreateEp(&params, addr.host + ":" + std::to_string(addr.port), &id));
  AwaitWired(*conns_[id]);
  ucp_worker_signal(worker_);
  return id;
}

// mu_ held. Sends to a connection we just made wait until a flush of its endpoint completed:
// UCP completes it once the endpoint is wired up.
void Worker::AwaitWired(Conn& conn) {
  auto ctx = std::make_unique<WireCtx>(WireCtx{this, conn.id});
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &Worker::OnWired;
  p.user_data = ctx.get();
  ucs_status_ptr_t req = ucp_ep_flush_nbx(conn.ep, &p);
  if (req == nullptr) return;  // wired already
  if (UCS_PTR_IS_ERR(req)) {
    MarkDown(conn.id, std::string("connect failed: ") + ucs_status_string(UCS_PTR_STATUS(req)));
    return;
  }
  conn.wired = false;
  ctx.release();  // OnWired deletes it
}

// mu_ held (inside progress or a close). The held sends are posted after progress returns.
void Worker::OnWired(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<WireCtx> ctx(static_cast<WireCtx*>(user_data));
  Worker* w = ctx->worker;
  ucp_request_free(request);
  if (status != UCS_OK) {
    w->MarkDown(ctx->conn, std::string("connect failed: ") + ucs_status_string(status));
    return;
  }
  w->wired_.push_back(ctx->conn);
}

std::string Worker::PeerName(ConnId conn) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = conns_.find(conn);
  return it == conns_.end() ? "?" : it->second->name;
}

std::string Worker::Lanes(ConnId conn) {
  char* text = nullptr;
  size_t len = 0;
  FILE* out = ::open_memstream(&text, &len);
  if (out == nullptr) return "?";
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = conns_.find(conn);
    if (it != conns_.end() && it->second->ep != nullptr) ucp_ep_print_info(it->second->ep, out);
  }
  std::fclose(out);
  std::string info(text, len);
  std::free(text);
  // Lines like "#   lane[0]:  8:posix/memory.0 md[4]  ...": keep the "tl/device" words.
  std::string lanes;
  for (size_t at = info.find("lane["); at != std::string::npos; at = info.find("lane[", at + 1)) {
    const size_t colon = info.find(':', info.find(':', at) + 1);
    const size_t end = info.find(' ', colon);
    if (colon == std::string::npos || end == std::string::npos) break;
    const std::string tl = info.substr(colon + 1, end - colon - 1);
    if (lanes.find(tl) == std::string::npos) lanes += (lanes.empty() ? "" : " ") + tl;
  }
  return lanes.empty() ? "?" : lanes;
}

Status Worker::Send(ConnId conn, const MsgHeader& header, Bytes data, SendDone done) {
  auto ctx = std::make_unique<SendCtx>();
  ctx->worker = this;
  ctx->conn = conn;
  ctx->header = EncodeHeader(header);
  ctx->data = std::move(data);
  ctx->done = std::move(done);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = conns_.find(conn);
  if (it == conns_.end() || it->second->dead || it->second->ep == nullptr) {
    return Status::IoError("ucx transport: the connection to " +
                           (it == conns_.end() ? std::string("?") : it->second->name) +
                           " is closed");
  }
  Conn& c = *it->second;
  if (c.pending == 0) c.last_progress = Clock::now();
  if (!c.wired) {
    ++c.pending;
    ++pending_sends_;
    c.held.push_back(std::move(ctx));
    return Status::OK();
  }
  return Post(c, ctx);
}

// mu_ held. Posts one send; on an error UCP gave at once, ctx stays the caller's.
Status Worker::Post(Conn& c, std::unique_ptr<SendCtx>& ctx) {
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &Worker::OnSendDone;
  p.user_data = ctx.get();
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  const void* buf = ctx->data ? ctx->data->data() : nullptr;
  const size_t len = ctx->data ? ctx->data->size() : 0;
  ucs_status_ptr_t req =
      ucp_am_send_nbx(c.ep, kAmId, ctx->header.data(), ctx->header.size(), buf, len, &p);
  if (UCS_PTR_IS_ERR(req)) {
    return UcsError("send to " + c.name + " failed", UCS_PTR_STATUS(req));
  }
  if (req == nullptr) {
    if (ctx->done) ctx->done(Status::OK());
    return Status::OK();
  }
  ++c.pending;
  ++pending_sends_;
  ctx.release();  // OnSendDone deletes it
  ucp_worker_signal(worker_);
  return Status::OK();
}

// mu_ held, outside any UCP callback. A connection wired up: its held sends go, in order.
void Worker::ReleaseHeld(ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  c.wired = true;
  std::vector<std::unique_ptr<SendCtx>> held;
  held.swap(c.held);
  for (auto& ctx : held) {
    --c.pending;
    --pending_sends_;
    Status st = c.dead
                    ? Status::IoError("ucx transport: the connection to " + c.name + " is closed")
                    : Post(c, ctx);
    if (st.ok()) continue;
    MarkDown(id, st.message());
    if (ctx->done) ctx->done(st);
  }
  flushed_.notify_all();
}

void Worker::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendCtx> ctx(static_cast<SendCtx*>(user_data));
  Worker* w = ctx->worker;  // mu_ is held: this runs inside progress or a close
  auto it = w->conns_.find(ctx->conn);
  if (it != w->conns_.end()) {
    --it->second->pending;
    it->second->last_progress = Clock::now();
  }
  --w->pending_sends_;
  w->flushed_.notify_all();
  Status st = status == UCS_OK ? Status::OK() : UcsError("send failed", status);
  if (status != UCS_OK)
    w->MarkDown(ctx->conn, std::string("send failed: ") + ucs_status_string(status));
  if (ctx->done) ctx->done(st);
  ucp_request_free(request);
}

void Worker::Close(ConnId conn, const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  MarkDown(conn, why);
  ucp_worker_signal(worker_);
}

bool Worker::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  ucp_worker_signal(worker_);
  const auto deadline = Clock::now() + timeout;
  while (pending_sends_ != 0) {
    if (flushed_.wait_until(lk, deadline) == std::cv_status::timeout) return pending_sends_ == 0;
  }
  return true;
}

// mu_ held. Once per connection: the event, then a forced close of its endpoint after progress.
void Worker::MarkDown(ConnId conn, const std::string& why) {
  auto it = conns_.find(conn);
  if (it == conns_.end() || it->second->dead) return;
  it->second->dead = true;
  to_close_.push_back(conn);
  Event e;
  e.kind = Event::Kind::kPeerDown;
  e.conn = conn;
  e.why = why;
  Deliver(std::move(e));
}

void Worker::Deliver(Event event) {
  {
    std::lock_guard<std::mutex> lk(events_mu_);
    events_.push_back(std::move(event));
  }
  events_cv_.notify_one();
}

void Worker::OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* conn = static_cast<Conn*>(arg);
  conn->worker->MarkDown(conn->id, std::string("connection lost: ") + ucs_status_string(status));
}

void Worker::OnConnRequest(ucp_conn_request_h request, void* arg) {
  static_cast<Worker*>(arg)->accepted_.push_back(request);
}

ucs_status_t Worker::OnAm(void* arg, const void* header, size_t header_length, void* data,
                          size_t length, const ucp_am_recv_param_t* param) {
  auto* w = static_cast<Worker*>(arg);
  auto ep = w->by_ep_.find(param->reply_ep);
  if (ep == w->by_ep_.end()) return UCS_OK;  // from an endpoint already closed
  const ConnId conn = ep->second;
  Result<MsgHeader> h = DecodeHeader(header, header_length);
  if (!h.ok()) {
    w->MarkDown(conn, h.status().message());
    return UCS_OK;
  }
  w->conns_[conn]->last_progress = Clock::now();
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    auto* ctx = new RecvCtx{w, conn, std::move(h).value(), Buffer(length)};
    w->rndv_.emplace_back(ctx, data);  // started after progress returns
    return UCS_INPROGRESS;             // keeps the descriptor until then
  }
  Event e;
  e.conn = conn;
  e.header = std::move(h).value();
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (length > 0) e.data.assign(bytes, bytes + length);
  w->Deliver(std::move(e));
  return UCS_OK;
}

void Worker::StartRndv(RecvCtx* ctx, void* desc) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &Worker::OnRecvDone;
  p.user_data = ctx;
  ucs_status_ptr_t req =
      ucp_am_recv_data_nbx(worker_, desc, ctx->data.data(), ctx->data.size(), &p);
  if (req == nullptr) {
    OnRecvDone(nullptr, UCS_OK, ctx->data.size(), ctx);
  } else if (UCS_PTR_IS_ERR(req)) {
    OnRecvDone(nullptr, UCS_PTR_STATUS(req), 0, ctx);
  }
}

void Worker::OnRecvDone(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  std::unique_ptr<RecvCtx> ctx(static_cast<RecvCtx*>(user_data));
  Worker* w = ctx->worker;
  if (request != nullptr) ucp_request_free(request);
  if (status != UCS_OK) {
    w->MarkDown(ctx->conn, std::string("receive failed: ") + ucs_status_string(status));
    return;
  }
  Event e;
  e.conn = ctx->conn;
  e.header = std::move(ctx->header);
  e.data = std::move(ctx->data);
  w->Deliver(std::move(e));
}

// mu_ held, outside any UCP callback: what the callbacks deferred.
void Worker::AfterProgress() {
  std::vector<ucp_conn_request_h> accepted;
  accepted.swap(accepted_);
  for (ucp_conn_request_h request : accepted) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    ConnId id = 0;
    Status st = CreateEp(&params, ClientAddress(request), &id);
    if (!st.ok()) sdk::Log(REFIT_LOG_WARN, "ucx", st.message());
  }
  std::vector<ConnId> wired;
  wired.swap(wired_);
  for (ConnId id : wired) ReleaseHeld(id);
  std::vector<std::pair<RecvCtx*, void*>> rndv;
  rndv.swap(rndv_);
  for (auto& [ctx, desc] : rndv) StartRndv(ctx, desc);
  std::vector<ConnId> to_close;
  to_close.swap(to_close_);
  for (ConnId id : to_close) {
    Conn& conn = *conns_[id];
    if (!conn.held.empty()) ReleaseHeld(id);  // dead: each fails
    if (conn.ep == nullptr) continue;
    by_ep_.erase(conn.ep);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    FreeRequest(ucp_ep_close_nbx(conn.ep, &p));
    conn.ep = nullptr;
  }
}

void Worker::CheckTimeouts() {
  const auto now = Clock::now();
  for (auto& [id, conn] : conns_) {
    if (conn->dead || conn->pending == 0 || now - conn->last_progress < send_timeout_) continue;
    MarkDown(id, "no send completed for " + std::to_string(send_timeout_.count() / 1000) +
                     " s (send_timeout_ms)");
  }
}

void Worker::ProgressLoop() {
  while (true) {
    ucs_status_t armed = UCS_OK;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      for (int i = 0; i < 4096 && ucp_worker_progress(worker_) != 0; ++i) {
      }
      AfterProgress();
      CheckTimeouts();
      armed = (rndv_.empty() && accepted_.empty() && to_close_.empty() && wired_.empty())
                  ? ucp_worker_arm(worker_)
                  : UCS_ERR_BUSY;
    }
    if (armed == UCS_ERR_BUSY) continue;
    pollfd pfd{efd_, POLLIN, 0};
    ::poll(&pfd, 1, 100);  // bounded: the send timeouts are checked at least this often
  }
}

void Worker::DispatchLoop() {
  while (true) {
    Event e;
    {
      std::unique_lock<std::mutex> lk(events_mu_);
      while (!events_stop_ && events_.empty()) events_cv_.wait(lk);
      if (events_stop_) return;
      e = std::move(events_.front());
      events_.pop_front();
    }
    handler_->OnEvent(std::move(e));
  }
}

}  // namespace refit::ucx
