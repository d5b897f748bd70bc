#include "ucx_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "common/transport_key.h"

namespace refit::ucx {

struct UcxTransport::Pending {
  bool done = false;
  Status status;
  uint64_t value = 0;
  uint64_t pushed = 0;
  uint64_t tree_seq = 0;  // size replies: the tree push of the key still on its way (0: none)
  ConnId conn = 0;        // the connection it was sent on: only its loss fails the request
  Buffer data;
};

namespace {

constexpr const char* kLog = "ucx";
// Dropped keys a receiver remembers (UcxTransport::dropped_): more than a retention pass drops.
constexpr size_t kMaxDroppedKeys = 4096;

// Completion of one object pushed to several receivers: its bytes leave the window once every
// send of it completed (or failed).
struct PushGroup {
  UcxTransport* transport = nullptr;
  uint64_t bytes = 0;
  std::atomic<size_t> left{0};  // completions run on the progress thread
};

struct PushDone {
  std::shared_ptr<PushGroup> group;
  void operator()(const Status& /*st*/) const {
    if (--group->left == 0) group->transport->PushCompleted(group->bytes);
  }
};

std::string StatusText(const Status& st) { return st.ok() ? "" : st.message(); }

Status FromReply(uint64_t code, const std::string& message) {
  if (code == 0) return Status::OK();
  return Status(static_cast<StatusCode>(code), message);
}

std::map<std::string, uint64_t> ParseListing(const std::string& text) {
  std::map<std::string, uint64_t> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    out[line.substr(0, tab)] = std::strtoull(line.c_str() + tab + 1, nullptr, 10);
  }
  return out;
}

std::map<std::string, uint64_t> ParseListing(const Buffer& body) {
  return ParseListing(std::string(body.begin(), body.end()));
}

bool IsPayloadKey(const std::string& key) { return key.find("/payload.") != std::string::npos; }

// A request that failed for its connection (none, lost, no answer), not for its answer: the
// messages Request and OnPeerDown make.
bool IsConnectionError(const Status& st) {
  return st.code() == StatusCode::kIoError && st.message().rfind("ucx transport: ", 0) == 0;
}

}  // namespace

Result<std::unique_ptr<UcxTransport>> UcxTransport::Create(const sdk::ConfigView& cfg,
                                                           refit_transport_role_t role,
                                                           const std::string& peer_id) {
  UcxOptions o;
  REFIT_ASSIGN_OR_RAISE(o.listen, cfg.GetString("listen", ""));
  REFIT_ASSIGN_OR_RAISE(o.connect, cfg.GetString("connect", ""));
  REFIT_ASSIGN_OR_RAISE(o.rendezvous_file, cfg.GetString("rendezvous_file", ""));
  REFIT_ASSIGN_OR_RAISE(o.tls, cfg.GetString("tls", "tcp"));
  REFIT_ASSIGN_OR_RAISE(o.spool_dir, cfg.GetString("spool_dir", ""));
  REFIT_ASSIGN_OR_RAISE(o.spool_fsync, cfg.GetBool("spool_fsync", true));
  REFIT_ASSIGN_OR_RAISE(o.max_inflight_bytes,
                        cfg.GetSize("max_inflight_bytes", o.max_inflight_bytes));
  REFIT_ASSIGN_OR_RAISE(o.inbox_bytes, cfg.GetSize("inbox_bytes", o.inbox_bytes));
  REFIT_ASSIGN_OR_RAISE(int64_t k, cfg.GetInt("k", 0));
  REFIT_ASSIGN_OR_RAISE(int64_t await_receivers, cfg.GetInt("await_receivers", 0));
  if (k < 0 || k > 64) {
    return Status::Invalid("ucx transport: k = " + std::to_string(k) + " is not in [0, 64]");
  }
  if (await_receivers < 0) {
    return Status::Invalid("ucx transport: await_receivers = " + std::to_string(await_receivers) +
                           " is negative");
  }
  REFIT_ASSIGN_OR_RAISE(o.link_bandwidth, cfg.GetSize("link_bandwidth", 0));
  o.k = static_cast<uint64_t>(k);
  o.await_receivers = static_cast<uint64_t>(await_receivers);
  const std::pair<const char*, std::chrono::milliseconds*> times[] = {
      {"connect_timeout_ms", &o.connect_timeout},
      {"reconnect_max_ms", &o.reconnect_max},
      {"send_timeout_ms", &o.send_timeout},
      {"request_timeout_ms", &o.request_timeout}};
  for (const auto& [name, field] : times) {
    REFIT_ASSIGN_OR_RAISE(int64_t ms, cfg.GetInt(name, field->count()));
    if (ms < 1 || ms > 86400000) {
      return Status::Invalid("ucx transport: " + std::string(name) + " = " + std::to_string(ms) +
                             " is not in [1, 86400000]");
    }
    *field = std::chrono::milliseconds(ms);
  }
  return Open(std::move(o), role, peer_id);
}

Result<std::unique_ptr<UcxTransport>> UcxTransport::Open(UcxOptions options,
                                                         refit_transport_role_t role,
                                                         const std::string& peer_id) {
  if (role != REFIT_ROLE_SENDER && role != REFIT_ROLE_RECEIVER) {
    return Status::Invalid("ucx transport: unknown role " + std::to_string(role));
  }
  std::unique_ptr<UcxTransport> t(new UcxTransport(std::move(options), role, peer_id));
  if (t->peer_id_.empty()) t->peer_id_ = "pid" + std::to_string(::getpid());
  if (t->options_.link_bandwidth > 0) {
    t->links_ = std::make_unique<LinkSchedule>(static_cast<double>(t->options_.link_bandwidth));
    t->pacer_ = std::make_unique<DelayedRunner>();
  }
  if (t->sender()) {
    REFIT_RETURN_NOT_OK(t->StartSender());
  } else {
    REFIT_RETURN_NOT_OK(t->StartReceiver());
  }
  return t;
}

Status UcxTransport::StartSender() {
  if (options_.listen.empty()) {
    if (options_.rendezvous_file.empty()) {
      return Status::Invalid(
          "ucx transport: the sender needs `listen = \"host:port\"` (or a rendezvous_file, "
          "then it listens on 127.0.0.1, any free port)");
    }
    options_.listen = "127.0.0.1:0";
  }
  REFIT_ASSIGN_OR_RAISE(HostPort want, ParseHostPort(options_.listen, "listen"));
  if (want.port == 0 && options_.rendezvous_file.empty()) {
    return Status::Invalid("ucx transport: listen = \"" + options_.listen +
                           "\" (port 0, any free port) needs a rendezvous_file to publish it");
  }
  std::string spool = options_.spool_dir;
  if (spool.empty()) {
    spool = options_.rendezvous_file.empty() ? "/tmp/refit-ucx-spool-" + std::to_string(want.port)
                                             : options_.rendezvous_file + ".spool";
  }
  disk::DiskOptions disk;
  disk.dir = spool;
  disk.fsync = options_.spool_fsync;
  REFIT_ASSIGN_OR_RAISE(spool_, disk::DiskTransport::Open(std::move(disk)));
  WorkerOptions wo;
  wo.tls = options_.tls;
  wo.send_timeout = options_.send_timeout;
  REFIT_ASSIGN_OR_RAISE(worker_, Worker::Start(wo, this));
  REFIT_ASSIGN_OR_RAISE(HostPort bound, worker_->Listen(want));
  address_ = bound.host + ":" + std::to_string(bound.port);
  if (!options_.rendezvous_file.empty()) {
    REFIT_RETURN_NOT_OK(
        internal::WriteFileAtomic(options_.rendezvous_file, address_ + "\n", false));
  }
  // Seqs of a newer sender process are larger: a receiver's inbox may hold an older one's.
  push_seq_ = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
  sdk::Log(REFIT_LOG_INFO, kLog,
           "sender listening on " + address_ + " (tls " + options_.tls +
               (options_.k > 0 ? ", relay fan-out k = " + std::to_string(options_.k) : "") + ")");
  return Status::OK();
}

// await_receivers, at the first put (the sender's diff runs while its receivers connect): that
// put goes down the tree to everyone instead of being replayed to each receiver that connects
// after it. Receivers are counted by id: one that reconnected has two connections until its
// stale one is closed.
void UcxTransport::AwaitReceivers() {
  if (options_.await_receivers == 0) return;
  std::unique_lock<std::mutex> lk(mu_);
  const auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
  auto connected = [&] {
    std::set<std::string> ids;
    for (const auto& [conn, peer] : peers_) ids.insert(peer.id);
    return ids.size();
  };
  while (connected() < options_.await_receivers) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) break;
  }
  sdk::Log(REFIT_LOG_DEBUG, kLog,
           std::to_string(connected()) + " of " + std::to_string(options_.await_receivers) +
               " awaited receivers connected before the first put");
}

void UcxTransport::LogBytesOut() {
  const uint64_t pushed = bytes_pushed_.load();
  const uint64_t replayed = bytes_replayed_.load();
  const uint64_t served = bytes_served_.load();
  sdk::Log(REFIT_LOG_INFO, kLog,
           "sender bytes out: " + std::to_string(pushed + replayed + served) + " (pushed " +
               std::to_string(pushed) + ", replayed " + std::to_string(replayed) +
               ", served to reads " + std::to_string(served) +
               "; k = " + std::to_string(options_.k) + ")");
}

UcxTransport::~UcxTransport() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (connector_.joinable()) connector_.join();
  // Paced pushes still on their emulated links (the last put, a relay's forwards) are posted
  // before anyone is told this instance leaves.
  if (pacer_ != nullptr) pacer_->Drain();
  if (!sender()) SayBye();
  if (relay_port_ != 0) {
    // A parent told to connect to us before the sender had our bye does so now: let that finish
    // while the worker still runs. UCX 1.13 crashes (ucp_cm_server_conn_request_cb, on its async
    // thread) when a connection request half received completes after its listener is gone.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!sender()) {
    sdk::Log(REFIT_LOG_DEBUG, kLog,
             "receiver " + peer_id_ + ": " + std::to_string(remote_gets_.load()) +
                 " reads were served by the sender (not pushed, evicted or read before); " +
                 std::to_string(bytes_forwarded_.load()) + " bytes forwarded to its children");
  }
  if (worker_ != nullptr && sender() && !worker_->Flush(options_.send_timeout)) {
    sdk::Log(REFIT_LOG_WARN, kLog, "sender exits with pushes not completed");
  }
  if (sender()) SayByeToReceivers();
  if (sender()) LogBytesOut();
  if (worker_ != nullptr) worker_->Stop();  // no handler call after this; then no worker
  pacer_.reset();  // drops a forward a handler queued after the drain: no worker to post it
  worker_.reset();
  if (sender() && !options_.rendezvous_file.empty()) {
    // Only ours: a newer sender may have taken the file over.
    Result<std::string> now = internal::ReadSmallFile(options_.rendezvous_file, 4096);
    if (now.ok() && now.value() == address_ + "\n") ::unlink(options_.rendezvous_file.c_str());
  }
}

// ------------------------------------------------------------------ sender

void UcxTransport::PushCompleted(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    inflight_ -= bytes;
  }
  cv_.notify_all();
}

std::vector<ConnId> UcxTransport::ReadyPeers() {
  std::lock_guard<std::mutex> lk(mu_);
  return ReadyPeersLocked();
}

std::vector<ConnId> UcxTransport::ReadyPeersLocked() const {
  std::vector<ConnId> out;
  for (const auto& [conn, peer] : peers_) {
    if (peer.ready) out.push_back(conn);
  }
  return out;
}

// mu_ held, the put's spool write done. Whom the put of `key` pushes to itself, taken now (so a
// receiver that became ready during the write gets it by push, not replay: PushLedger): with
// the tree, the sender's tree children and every ready receiver outside it (the tree forwards
// it to the rest); else every ready receiver.
std::vector<ConnId> UcxTransport::TakePutTargetsLocked(const std::string& key) {
  ledger_.Took(key);
  if (options_.k == 0) return ReadyPeersLocked();
  std::vector<ConnId> out = TreeChildrenLocked(0);
  for (const auto& [conn, peer] : peers_) {
    if (peer.ready && !peer.in_tree) out.push_back(conn);
  }
  return out;
}

// ------------------------------------------------------------------ sender: the relay tree

// mu_ held. Node 0 is the sender, node i + 1 is tree_[i]; node n's children are nodes n*k + 1 ..
// n*k + k: the tree is as shallow as k allows and a receiver joining is its last leaf.
std::vector<ConnId> UcxTransport::TreeChildrenLocked(size_t node) {
  std::vector<ConnId> out;
  for (size_t child = node * options_.k + 1;
       child <= node * options_.k + options_.k && child <= tree_.size(); ++child) {
    out.push_back(tree_[child - 1]);
  }
  return out;
}

// A put's push seq (with the tree, its tree push's), taken before the object is in the spool: a
// receiver that sees it there (a list, a size) is told to wait for that push rather than read it
// from the sender (AwaitedPushSeq). A receiver placed in the tree after this seq was taken gets it
// some other way (placed_at >= seq).
uint64_t UcxTransport::TakePushSeq(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  push_seq_of_[key] = ++push_seq_;
  return push_seq_;
}

// A put (header.id: its tree seq): the sender's tree children and every receiver outside the
// tree (one that does not relay) get it; the tree forwards it to the rest. tree_mu_ is held while
// it is posted, so every kTree posted before it reached the sender's connections first.
Status UcxTransport::PushDown(const MsgHeader& header, Bytes data) {
  const uint64_t bytes = data ? data->size() : 0;
  ReserveWindow(bytes);
  std::lock_guard<std::mutex> tree(tree_mu_);
  std::vector<ConnId> conns;
  {
    std::lock_guard<std::mutex> lk(mu_);
    conns = TakePutTargetsLocked(header.key);
  }
  PostPush(conns, header, std::move(data), bytes, &bytes_pushed_);
  return Status::OK();
}

// tree_mu_ held. Tells each of `to` its children ("host:port\tplaced_at" lines: a relay forwards
// a new child what it holds past that seq) and its own placed_at.
void UcxTransport::SendTreeLocked(const std::vector<ConnId>& to) {
  std::vector<std::pair<ConnId, MsgHeader>> messages;
  std::vector<Bytes> lists;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (ConnId conn : to) {
      auto at = std::find(tree_.begin(), tree_.end(), conn);
      if (at == tree_.end()) continue;
      std::string text;
      for (ConnId child : TreeChildrenLocked(static_cast<size_t>(at - tree_.begin()) + 1)) {
        auto c = peers_.find(child);
        if (c == peers_.end()) continue;  // dropped; its LeaveTree follows
        text += c->second.relay_address + "\t" + std::to_string(c->second.placed_at) + "\n";
      }
      auto peer = peers_.find(conn);
      if (peer == peers_.end()) continue;
      MsgHeader h;
      h.type = MsgType::kTree;
      h.a = peer->second.placed_at;
      messages.emplace_back(conn, h);
      lists.push_back(std::make_shared<const Buffer>(text.begin(), text.end()));
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    Status st = worker_->Send(messages[i].first, messages[i].second, lists[i], nullptr);
    if (!st.ok()) worker_->Close(messages[i].first, st.message());
  }
}

// A receiver that relays joins as the last leaf: only it and its parent hear of it.
void UcxTransport::JoinTree(ConnId conn) {
  std::lock_guard<std::mutex> tree(tree_mu_);
  std::vector<ConnId> told = {conn};
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto peer = peers_.find(conn);
    if (peer == peers_.end() || peer->second.in_tree) return;
    peer->second.in_tree = true;
    peer->second.placed_at = push_seq_;
    tree_.push_back(conn);
    const size_t parent = (tree_.size() - 1) / options_.k;  // node number; 0: the sender
    if (parent > 0) told.push_back(tree_[parent - 1]);
  }
  SendTreeLocked(told);
}

// mu_ held. Node `node` and every node below it.
std::vector<size_t> UcxTransport::SubtreeLocked(size_t node) {
  std::vector<size_t> out = {node};
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t child = out[i] * options_.k + 1;
         child <= out[i] * options_.k + options_.k && child <= tree_.size(); ++child) {
      out.push_back(child);
    }
  }
  return out;
}

// A receiver left or was dropped: the last leaf takes its place (no other receiver moves). That
// leaf and the subtree it now heads are re-placed: a tree push on its way through the dropped
// receiver may never reach them, so they read what they miss from the sender. Their parents hear
// of their new children.
void UcxTransport::LeaveTree(ConnId conn) {
  std::lock_guard<std::mutex> tree(tree_mu_);
  std::vector<ConnId> told;
  size_t hole = 0;
  size_t remain = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto at = std::find(tree_.begin(), tree_.end(), conn);
    if (at == tree_.end()) return;
    hole = static_cast<size_t>(at - tree_.begin()) + 1;  // node numbers: 0 is the sender
    const size_t last = tree_.size();
    *at = tree_.back();
    tree_.pop_back();
    remain = tree_.size();
    std::vector<size_t> parents = {(last - 1) / options_.k};  // the last leaf's old parent
    if (hole != last) {
      parents.push_back((hole - 1) / options_.k);
      for (size_t node : SubtreeLocked(hole)) {
        auto peer = peers_.find(tree_[node - 1]);
        if (peer != peers_.end()) peer->second.placed_at = push_seq_;
        told.push_back(tree_[node - 1]);
      }
    }
    for (size_t parent : parents) {
      if (parent > 0 && parent <= tree_.size()) told.push_back(tree_[parent - 1]);
    }
  }
  std::sort(told.begin(), told.end());
  told.erase(std::unique(told.begin(), told.end()), told.end());
  sdk::Log(REFIT_LOG_INFO, kLog,
           "relay tree: node " + std::to_string(hole) + " left, " + std::to_string(remain) +
               " receivers remain, " + std::to_string(told.size()) + " told their new place");
  SendTreeLocked(told);
}

// A relay says a child of its stopped taking data: that receiver is dropped like one whose sends
// time out here (it reconnects and catches up as a late joiner).
void UcxTransport::OnReport(const Event& e) {
  std::optional<ConnId> victim;
  std::string relay;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [conn, peer] : peers_) {
      if (peer.relay_address == e.header.key) victim = conn;
      if (conn == e.conn) relay = peer.id;
    }
  }
  if (!victim) return;  // gone already
  worker_->Close(*victim,
                 "its relay " + relay + " reported: " + std::string(e.data.begin(), e.data.end()));
}

// mu_ held. The push of `key` a receiver may still be waiting for (its seq; 0: none, read it
// here). In the tree: a tree push past its placement. Outside it: the put's own push to it, when
// the put takes it (under way) or took it (ready before): a count of pushes does not tell, since
// the small pushes posted after a payload (its manifest, the commit) can arrive before it.
uint64_t UcxTransport::AwaitedPushSeq(ConnId conn, const std::string& key) {
  auto peer = peers_.find(conn);
  auto seq = push_seq_of_.find(key);
  if (peer == peers_.end() || seq == push_seq_of_.end()) return 0;
  if (peer->second.in_tree) return seq->second > peer->second.placed_at ? seq->second : 0;
  const bool pushed = peer->second.ready && ledger_.PushedTo(key, peer->second.ready_epoch);
  return pushed ? seq->second : 0;
}

// Pushes one object to conns, within the max_inflight_bytes window (an object larger than the
// window goes alone). A receiver the send cannot reach is dropped, never waited for.
Status UcxTransport::PushTo(const std::vector<ConnId>& conns, const MsgHeader& header, Bytes data,
                            std::atomic<uint64_t>* bytes_out) {
  if (conns.empty()) return Status::OK();
  const uint64_t bytes = data ? data->size() : 0;
  ReserveWindow(bytes);
  if (bytes_out == nullptr) bytes_out = sender() ? &bytes_pushed_ : &bytes_forwarded_;
  PostPush(conns, header, std::move(data), bytes, bytes_out);
  return Status::OK();
}

void UcxTransport::ReserveWindow(uint64_t bytes) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_ && inflight_ != 0 && inflight_ + bytes > options_.max_inflight_bytes) {
    cv_.wait(lk);
  }
  inflight_ += bytes;
}

// link_bandwidth: pushes of puts and their forwards are posted once they crossed their emulated
// links (ucx_pacer.h), on the pacer's thread: the pushing thread goes on. Replays and replies are
// not paced: the dispatch thread sends them, and holding them back would only delay the answers
// (an artifact of the emulation, not of a link).
void UcxTransport::PostPush(const std::vector<ConnId>& conns, const MsgHeader& header, Bytes data,
                            uint64_t bytes, std::atomic<uint64_t>* bytes_out) {
  if (pacer_ == nullptr || bytes_out == &bytes_replayed_) {
    SendPush(conns, header, std::move(data), bytes, bytes_out, /*counted=*/false);
    return;
  }
  PaceClock::time_point arrival;
  {
    std::lock_guard<std::mutex> lk(mu_);
    arrival = links_->Arrival(conns, bytes, PaceClock::now());
    // Counted now, not when posted: a receiver that reads a key the spool already lists (its
    // commit) waits for the pushes on their links rather than reading it from the sender, whose
    // replies are not paced.
    for (ConnId conn : conns) {
      auto peer = peers_.find(conn);
      if (peer != peers_.end()) ++peer->second.pushed;
    }
  }
  pacer_->Post(arrival, [this, conns, header, data = std::move(data), bytes, bytes_out]() mutable {
    SendPush(conns, header, std::move(data), bytes, bytes_out, /*counted=*/true);
  });
}

// Sends one object (its bytes already in the window) to conns; they leave the window once every
// send of it completed or failed. bytes_out counts what was posted; `counted`: the peers' push
// counts (their read barrier) were raised when the push was paced.
void UcxTransport::SendPush(const std::vector<ConnId>& conns, const MsgHeader& header, Bytes data,
                            uint64_t bytes, std::atomic<uint64_t>* bytes_out, bool counted) {
  auto group = std::make_shared<PushGroup>();
  group->transport = this;
  group->bytes = bytes;
  group->left = conns.size() + 1;  // +1: ours, released once every send is posted
  for (ConnId conn : conns) {
    Status st = worker_->Send(conn, header, data, PushDone{group});
    if (!st.ok()) {
      PushDone{group}(st);
      worker_->Close(conn, st.message());
      continue;
    }
    *bytes_out += bytes;
    if (counted) continue;
    std::lock_guard<std::mutex> lk(mu_);
    auto peer = peers_.find(conn);
    if (peer != peers_.end()) ++peer->second.pushed;
  }
  PushDone{group}(Status::OK());
}

Result<Bytes> UcxTransport::ReadSpool(const std::string& key, uint64_t offset, uint64_t len) {
  auto out = std::make_shared<Buffer>(len);
  REFIT_RETURN_NOT_OK(spool_->Get(key, offset, out->data(), len));
  return Bytes(std::move(out));
}

void UcxTransport::Reply(ConnId conn, uint64_t id, const Status& st, uint64_t value, Bytes data,
                         uint64_t tree_seq) {
  MsgHeader h;
  h.d = tree_seq;
  h.type = MsgType::kReply;
  h.id = id;
  h.a = static_cast<uint64_t>(st.code());
  h.b = value;
  h.key = StatusText(st);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto peer = peers_.find(conn);
    if (peer != peers_.end()) h.c = peer->second.pushed;
  }
  Status sent = worker_->Send(conn, h, std::move(data), nullptr);
  if (!sent.ok()) worker_->Close(conn, sent.message());
}

// A receiver said who it is: it joins the pushes at once (so no put is missed), then gets every
// spool object it does not hold replayed and is told which of its objects are gone.
void UcxTransport::OnHello(const Event& e) {
  const std::string& id = e.header.key;
  // Its relay address: the port it listens on, at the address it connected from. Asked of the
  // worker before mu_ is taken (the lock order is the worker's mutex, then ours).
  const std::string from = worker_->PeerName(e.conn);
  const bool relays = options_.k > 0 && e.header.a > 0 && e.header.a <= 65535;
  std::vector<ConnId> stale;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [conn, peer] : peers_) {
      if (peer.id == id && conn != e.conn) stale.push_back(conn);
    }
    Peer& peer = peers_[e.conn];
    peer.id = id;
    peer.ready = true;
    peer.ready_epoch = ledger_.epoch();
    if (relays) {
      peer.relay_address = from.substr(0, from.rfind(':')) + ":" + std::to_string(e.header.a);
    }
  }
  cv_.notify_all();  // AwaitReceivers
  for (ConnId conn : stale) worker_->Close(conn, "receiver " + id + " reconnected");
  if (relays) JoinTree(e.conn);
  sdk::Log(REFIT_LOG_INFO, kLog, "receiver " + id + " connected from " + from);
  sdk::Log(REFIT_LOG_DEBUG, kLog, "receiver " + id + " lanes: " + worker_->Lanes(e.conn));
  Replay(e.conn, std::string(e.data.begin(), e.data.end()));
  Reply(e.conn, e.header.id, Status::OK(), 0, nullptr);
}

void UcxTransport::Replay(ConnId conn, const std::string& inventory) {
  std::map<std::string, uint64_t> held = ParseListing(inventory);
  Result<std::vector<std::pair<std::string, uint64_t>>> listed = spool_->List("");
  if (!listed.ok()) {
    sdk::Log(REFIT_LOG_WARN, kLog, "replay: " + listed.status().message());
    return;
  }
  uint64_t replayed = 0;
  for (const auto& [key, size] : listed.value()) {
    auto it = held.find(key);
    const bool has = it != held.end() && it->second == size;
    if (it != held.end()) held.erase(it);
    if (has) continue;
    {
      // A put written to the spool as this receiver joined is pushed to it already.
      std::lock_guard<std::mutex> lk(mu_);
      auto peer = peers_.find(conn);
      if (peer == peers_.end() || ledger_.PushedTo(key, peer->second.ready_epoch)) continue;
    }
    Result<Bytes> data = ReadSpool(key, 0, size);
    if (!data.ok()) continue;  // removed meanwhile: its drop follows
    MsgHeader h;
    h.type = MsgType::kPush;
    h.key = key;
    PushTo({conn}, h, std::move(data).value(), &bytes_replayed_).ok();
    ++replayed;
  }
  for (const auto& [key, size] : held) {
    MsgHeader h;
    h.type = MsgType::kDrop;
    h.key = key;
    PushTo({conn}, h, nullptr).ok();
  }
  sdk::Log(REFIT_LOG_DEBUG, kLog, "replayed " + std::to_string(replayed) + " objects");
}

// A receiver's request, answered from the spool. Keys are checked here too: a peer is input.
void UcxTransport::OnRequest(const Event& e) {
  const MsgHeader& h = e.header;
  Status st =
      h.type == MsgType::kList ? ValidateTransportPrefix(h.key) : ValidateTransportKey(h.key);
  uint64_t value = 0;
  uint64_t tree_seq = 0;
  Bytes data;
  if (st.ok() && h.type == MsgType::kUpload) {
    st = spool_->Put(h.key, e.data.data(), e.data.size());
    if (st.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      ++arrivals_;
    }
    cv_.notify_all();  // a Wait for acks
  } else if (st.ok() && h.type == MsgType::kRemove) {
    st = spool_->Remove(h.key);
  } else if (st.ok() && h.type == MsgType::kSize) {
    Result<std::optional<uint64_t>> size = spool_->Size(h.key);
    st = size.status();
    if (st.ok() && size.value()) value = **size + 1;  // 0: not found
    std::lock_guard<std::mutex> lk(mu_);
    tree_seq = AwaitedPushSeq(e.conn, h.key);
  } else if (st.ok() && h.type == MsgType::kGet) {
    Result<Bytes> got = ReadSpool(h.key, h.a, h.b);
    st = got.status();
    if (st.ok()) data = std::move(got).value();
    if (st.ok()) bytes_served_ += data->size();
  } else if (st.ok() && h.type == MsgType::kList) {
    Result<std::vector<std::pair<std::string, uint64_t>>> listed = spool_->List(h.key);
    st = listed.status();
    if (st.ok()) {
      std::string text;
      for (const auto& [key, size] : listed.value())
        text += key + "\t" + std::to_string(size) + "\n";
      data = std::make_shared<Buffer>(text.begin(), text.end());
    }
  }
  Reply(e.conn, h.id, st, value, std::move(data), tree_seq);
}

void UcxTransport::OnBye(const Event& e) {
  std::string id;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = peers_.find(e.conn);
    if (it == peers_.end()) return;
    id = it->second.id;
    peers_.erase(it);
  }
  sdk::Log(REFIT_LOG_INFO, kLog, "receiver " + id + " left");
  LeaveTree(e.conn);
}

// Tells every receiver connected to this sender that it leaves on purpose (so they log no
// failure), best effort: they reconnect to the next sender as they would anyway.
void UcxTransport::SayByeToReceivers() {
  std::vector<ConnId> receivers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [conn, peer] : peers_) receivers.push_back(conn);
  }
  SendBye(receivers);
}

// kBye on each of `conns`, flushed for at most 500 ms (the peer may be gone already).
void UcxTransport::SendBye(const std::vector<ConnId>& conns) {
  if (conns.empty() || worker_ == nullptr) return;
  MsgHeader h;
  h.type = MsgType::kBye;
  bool sent = false;
  for (ConnId conn : conns) sent = worker_->Send(conn, h, nullptr, nullptr).ok() || sent;
  if (sent) worker_->Flush(std::chrono::milliseconds(500));
}

void UcxTransport::OnSenderBye(const Event& e) {
  std::lock_guard<std::mutex> lk(mu_);
  if (conn_ && *conn_ == e.conn) sender_left_ = e.conn;
}

void UcxTransport::OnPeerDown(const Event& e) {
  std::string id;
  bool was_sender = false;
  bool sender_said_bye = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = peers_.find(e.conn);
    if (it != peers_.end()) {
      id = it->second.id;
      peers_.erase(it);
    }
    if (conn_ && *conn_ == e.conn) {
      conn_.reset();
      was_sender = true;
      sender_said_bye = sender_left_ == e.conn;
      sender_left_.reset();
    }
    if (links_ != nullptr) links_->Forget(e.conn);
    for (auto& [rid, p] : pending_) {
      if (!p->done && p->conn == e.conn) {
        p->done = true;
        p->status = Status::IoError("ucx transport: the sender " + address_ + " is gone: " + e.why);
      }
    }
  }
  cv_.notify_all();
  if (sender() && !id.empty()) {
    sdk::Log(REFIT_LOG_WARN, kLog, "receiver " + id + " dropped: " + e.why);
  } else if (was_sender && sender_said_bye) {
    sdk::Log(REFIT_LOG_INFO, kLog, "the sender " + address_ + " left");
  } else if (was_sender) {
    sdk::Log(REFIT_LOG_INFO, kLog, "disconnected from the sender " + address_ + ": " + e.why);
  }
  if (sender()) LeaveTree(e.conn);
  if (!sender() && !was_sender) OnChildDown(e);
}

void UcxTransport::OnEvent(Event event) {
  if (event.kind == Event::Kind::kPeerDown) return OnPeerDown(event);
  const MsgType type = event.header.type;
  if (sender()) {
    if (type == MsgType::kHello) return OnHello(event);
    if (type == MsgType::kBye) return OnBye(event);
    if (type == MsgType::kReport) return OnReport(event);
    if (type == MsgType::kUpload || type == MsgType::kRemove || type == MsgType::kSize ||
        type == MsgType::kGet || type == MsgType::kList) {
      return OnRequest(event);
    }
  } else {
    if (type == MsgType::kPush || type == MsgType::kDrop) return OnPush(std::move(event));
    if (type == MsgType::kReply) return OnReply(std::move(event));
    if (type == MsgType::kTree) return OnTree(event);
    if (type == MsgType::kBye) return OnSenderBye(event);
  }
  worker_->Close(event.conn, "unexpected message type " + std::to_string(static_cast<int>(type)) +
                                 " for this role");
}

// ------------------------------------------------------------------ receiver

Status UcxTransport::StartReceiver() {
  if (options_.connect.empty() && options_.rendezvous_file.empty()) {
    return Status::Invalid(
        "ucx transport: a receiver needs `connect = \"host:port\"` of the sender or the "
        "sender's rendezvous_file");
  }
  if (!options_.connect.empty())
    REFIT_RETURN_NOT_OK(ParseHostPort(options_.connect, "connect").status());
  WorkerOptions wo;
  wo.tls = options_.tls;
  wo.send_timeout = options_.send_timeout;
  REFIT_ASSIGN_OR_RAISE(worker_, Worker::Start(wo, this));
  if (options_.k > 0) {
    // Any interface, any free port: the sender tells our parent the address we connect from.
    REFIT_ASSIGN_OR_RAISE(HostPort relay, worker_->Listen(HostPort{"0.0.0.0", 0}));
    relay_port_ = relay.port;
  }
  connector_ = std::thread(&UcxTransport::ConnectLoop, this);
  // A sender already up is joined before the first call; one that is not is waited for in the
  // background (a receiver may well start first).
  std::unique_lock<std::mutex> lk(mu_);
  const auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
  while (!conn_ && cv_.wait_until(lk, deadline) != std::cv_status::timeout) {
  }
  return Status::OK();
}

void UcxTransport::ConnectLoop() {
  auto backoff = std::chrono::milliseconds(20);
  std::string last_error;
  while (true) {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_ && conn_) cv_.wait(lk);
    if (stop_) return;
    lk.unlock();
    Status st = ConnectOnce();
    lk.lock();
    if (st.ok()) {
      backoff = std::chrono::milliseconds(20);
      last_error.clear();
      continue;
    }
    if (st.message() != last_error) {
      sdk::Log(REFIT_LOG_DEBUG, kLog, "connecting: " + st.message());
      last_error = st.message();
    }
    cv_.wait_for(lk, backoff);
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
}

Status UcxTransport::ConnectOnce() {
  std::string target = options_.connect;
  if (target.empty()) {
    REFIT_ASSIGN_OR_RAISE(target, internal::ReadSmallFile(options_.rendezvous_file, 4096));
    while (!target.empty() && (target.back() == '\n' || target.back() == ' ')) target.pop_back();
  }
  REFIT_ASSIGN_OR_RAISE(HostPort addr, ParseHostPort(target, "sender address"));
  REFIT_ASSIGN_OR_RAISE(ConnId conn, worker_->Connect(addr));
  {
    std::lock_guard<std::mutex> lk(mu_);
    address_ = target;
    push_conn_ = conn;
    delivered_ = 0;
    placed_at_ = 0;  // until this sender places us in its tree
  }
  std::string inventory = Inventory();
  auto data = std::make_shared<Buffer>(inventory.begin(), inventory.end());
  Result<std::shared_ptr<Pending>> hello =
      Request(conn, MsgType::kHello, peer_id_, relay_port_, 0, std::move(data));
  Status st = hello.ok() ? FlushOutbox(conn) : hello.status();
  if (!st.ok()) {
    worker_->Close(conn, st.message());
    return st;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    conn_ = conn;
    synced_ = true;
  }
  cv_.notify_all();
  sdk::Log(REFIT_LOG_INFO, kLog, "receiver " + peer_id_ + " connected to the sender " + target);
  return Status::OK();
}

// Tells the sender this receiver leaves on purpose (so it logs no failure), best effort.
void UcxTransport::SayBye() {
  std::optional<ConnId> conn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    conn = conn_;
  }
  if (!conn || worker_ == nullptr) return;
  sdk::Log(REFIT_LOG_DEBUG, kLog, "lanes to the sender: " + worker_->Lanes(*conn));
  SendBye({*conn});
}

std::string UcxTransport::Inventory() {
  std::lock_guard<std::mutex> lk(mu_);
  std::string text;
  for (const auto& [key, entry] : inbox_) {
    if (outbox_.count(key) == 0) text += key + "\t" + std::to_string(entry.size) + "\n";
  }
  return text;
}

// Puts and removes made while no sender was there, in key order (each key's last one).
Status UcxTransport::FlushOutbox(ConnId conn) {
  std::map<std::string, std::optional<Bytes>> queued;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queued = outbox_;
  }
  for (const auto& [key, data] : queued) {
    const MsgType type = data ? MsgType::kUpload : MsgType::kRemove;
    REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Pending> p,
                          Request(conn, type, key, 0, 0, data ? *data : nullptr));
    REFIT_RETURN_NOT_OK(p->status);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = outbox_.find(key);
    if (it != outbox_.end() && it->second == data) outbox_.erase(it);
  }
  return Status::OK();
}

// One request to the sender and its answer (conn: a connection still being set up; nullopt:
// the live one). A transport failure is an IoError; the answer's own status is in the result.
Result<std::shared_ptr<UcxTransport::Pending>> UcxTransport::Request(std::optional<ConnId> conn,
                                                                     MsgType type,
                                                                     const std::string& key,
                                                                     uint64_t a, uint64_t b,
                                                                     Bytes data) {
  auto p = std::make_shared<Pending>();
  MsgHeader h;
  h.type = type;
  h.key = key;
  h.a = a;
  h.b = b;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!conn) conn = conn_;
    if (!conn) {
      return Status::IoError("ucx transport: not connected to the sender" +
                             (address_.empty() ? std::string() : " " + address_));
    }
    h.id = next_request_++;
    p->conn = *conn;
    pending_[h.id] = p;
  }
  Status st = worker_->Send(*conn, h, std::move(data), nullptr);
  std::unique_lock<std::mutex> lk(mu_);
  const auto deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  while (st.ok() && !p->done && !stop_) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) break;
  }
  pending_.erase(h.id);
  if (!st.ok()) return st;
  if (!p->done) {
    lk.unlock();
    worker_->Close(*conn, "no answer within request_timeout_ms");
    return Status::IoError("ucx transport: the sender " + address_ + " did not answer '" + key +
                           "' in time");
  }
  if (p->status.code() == StatusCode::kIoError && p->status.message().find("ucx transport") == 0) {
    return p->status;  // the connection failed, not the request
  }
  return p;
}

void UcxTransport::OnReply(Event e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pending_.find(e.header.id);
    if (it == pending_.end()) return;  // timed out meanwhile
    Pending& p = *it->second;
    p.done = true;
    p.status = FromReply(e.header.a, e.header.key);
    p.value = e.header.b;
    p.pushed = e.header.c;
    p.tree_seq = e.header.d;
    p.data = std::move(e.data);
  }
  cv_.notify_all();
}

void UcxTransport::OnPush(Event e) {
  const std::string& key = e.header.key;
  if (!ValidateTransportKey(key).ok()) {
    worker_->Close(e.conn, "pushed an invalid key");
    return;
  }
  if (e.header.type == MsgType::kDrop) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = inbox_.find(key);
    if (it != inbox_.end()) {
      if (it->second.data) inbox_held_ -= it->second.size;
      inbox_.erase(it);
    }
    // A read told to wait for this key's push may not have looked since it arrived.
    dropped_[key] = ++drops_;
    dropped_order_.emplace_back(key, drops_);
    while (dropped_order_.size() > kMaxDroppedKeys) {
      const auto& [oldest, serial] = dropped_order_.front();
      auto d = dropped_.find(oldest);
      if (d != dropped_.end() && d->second == serial) dropped_.erase(d);  // not dropped since
      dropped_order_.pop_front();
    }
  } else {
    Bytes data = std::make_shared<const Buffer>(std::move(e.data));
    StoreInInbox(key, data, e.header.id);
    // A relay forwards a tree push on at once, before the runtime reads it (within its own
    // in-flight window: a child that takes nothing is dropped after send_timeout_ms).
    std::vector<ConnId> children;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.header.id != 0) {
        for (const auto& [address, conn] : children_) children.push_back(conn);
      }
    }
    PushTo(children, e.header, std::move(data)).ok();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (push_conn_ == e.conn) ++delivered_;
    ++arrivals_;  // a drop too: a Wait then looks again, as for an object
  }
  cv_.notify_all();
}

// The sender (re)placed this receiver in its tree: connect to new children (and forward them
// what arrived for them before this message did), close the ones no longer ours.
void UcxTransport::OnTree(const Event& e) {
  std::map<std::string, uint64_t> wanted;  // "host:port" -> the child's placed_at
  for (const auto& [address, placed_at] : ParseListing(e.data)) {
    if (ParseHostPort(address, "relay child").ok()) wanted[address] = placed_at;
  }
  std::map<std::string, uint64_t> added;
  std::vector<ConnId> gone;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (push_conn_ != e.conn) return;  // an older sender's
    placed_at_ = std::max(placed_at_, e.header.a);
    for (auto it = children_.begin(); it != children_.end();) {
      if (wanted.count(it->first) != 0) {
        ++it;
        continue;
      }
      gone.push_back(it->second);
      it = children_.erase(it);
    }
    for (const auto& [address, placed_at] : wanted) {
      if (children_.count(address) == 0) added[address] = placed_at;
    }
  }
  cv_.notify_all();  // a read waiting for a push our new placed_at_ covers reads the sender
  for (ConnId conn : gone) worker_->Close(conn, "no longer a child in the relay tree");
  ConnectChildren(added);
}

void UcxTransport::ConnectChildren(const std::map<std::string, uint64_t>& added) {
  for (const auto& [address, placed_at] : added) {
    Result<ConnId> conn = worker_->Connect(ParseHostPort(address, "relay child").value());
    if (!conn.ok()) {
      sdk::Log(REFIT_LOG_WARN, kLog, "relay: " + conn.status().message());
      continue;
    }
    std::vector<std::pair<MsgHeader, Bytes>> held;
    {
      std::lock_guard<std::mutex> lk(mu_);
      children_[address] = *conn;
      for (const auto& [key, entry] : inbox_) {
        if (entry.data && entry.tree_seq > placed_at) {
          MsgHeader h;
          h.type = MsgType::kPush;
          h.id = entry.tree_seq;
          h.key = key;
          held.emplace_back(h, entry.data);
        }
      }
    }
    for (auto& [h, data] : held) PushTo({*conn}, h, std::move(data)).ok();
  }
}

// A child's connection failed (it died, or took no data for send_timeout_ms): the sender is told,
// drops it and re-parents its subtree; this relay goes on with its other children.
void UcxTransport::OnChildDown(const Event& e) {
  std::string address;
  std::optional<ConnId> sender_conn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = children_.begin(); it != children_.end(); ++it) {
      if (it->second != e.conn) continue;
      address = it->first;
      children_.erase(it);
      break;
    }
    sender_conn = conn_;
  }
  if (address.empty()) return;  // not a child (a parent's connection to us ended)
  sdk::Log(REFIT_LOG_WARN, kLog, "relay: child " + address + " dropped: " + e.why);
  if (!sender_conn) return;  // the next sender builds a tree of its own
  MsgHeader h;
  h.type = MsgType::kReport;
  h.key = address;
  auto why = std::make_shared<const Buffer>(e.why.begin(), e.why.end());
  worker_->Send(*sender_conn, h, why, nullptr).ok();
}

// Until every push the sender had posted to us when it answered has arrived (or the connection
// is gone, or request_timeout_ms passed): a payload pushed by rendezvous may still be on its way
// when the small commit marker pushed after it is already here.
// Also until the key's own push (tree_seq, 0: none) arrived, from the sender or through our
// parent, or the sender re-placed us in its tree past it (it may never come: read it from the
// sender). The count alone is not enough: later small pushes can arrive before the payload.
void UcxTransport::WaitForPushes(uint64_t pushed, uint64_t tree_seq, const std::string& key) {
  std::unique_lock<std::mutex> lk(mu_);
  const std::optional<ConnId> conn = push_conn_;
  const auto deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  auto push_due = [&] {
    if (tree_seq <= placed_at_ || dropped_.count(key) != 0) return false;
    auto it = inbox_.find(key);
    return it == inbox_.end() || it->second.tree_seq < tree_seq;
  };
  while (!stop_ && conn_ == conn && push_conn_ == conn && (delivered_ < pushed || push_due())) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) return;
  }
}

// Replaces key's object whole (readers holding the old one keep it); evicts the oldest objects
// past inbox_bytes: a read of one of them goes to the sender.
void UcxTransport::StoreInInbox(const std::string& key, Bytes data, uint64_t tree_seq) {
  std::lock_guard<std::mutex> lk(mu_);
  dropped_.erase(key);  // pushed again (its place in dropped_order_ ages out)
  Entry& entry = inbox_[key];
  if (entry.data) inbox_held_ -= entry.size;
  entry.size = data->size();
  entry.data = std::move(data);
  entry.seq = ++inbox_seq_;
  entry.tree_seq = tree_seq;
  inbox_held_ += entry.size;
  while (inbox_held_ > options_.inbox_bytes) {
    auto oldest = inbox_.end();
    for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
      if (it->second.data && it->first != key &&
          (oldest == inbox_.end() || it->second.seq < oldest->second.seq)) {
        oldest = it;
      }
    }
    if (oldest == inbox_.end()) break;
    // The size stays: the sender replays only what a receiver does not list as held.
    inbox_held_ -= oldest->second.size;
    oldest->second.data.reset();
  }
}

// True when the inbox answered (*st is the answer). A payload read to its end leaves the inbox
// (its size stays): the receiver reads each payload once to apply it; a later read of it is
// served by the sender.
bool UcxTransport::GetFromInbox(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len,
                                Status* st) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = inbox_.find(key);
  if (it == inbox_.end() || !it->second.data) return false;
  Entry& entry = it->second;
  if (offset > entry.size || len > entry.size - offset) {
    *st = Status::Corrupt("ucx transport: get '" + key + "' [" + std::to_string(offset) + ", +" +
                          std::to_string(len) + ") is past its end (" + std::to_string(entry.size) +
                          " bytes)");
    return true;
  }
  if (len > 0) std::memcpy(buf, entry.data->data() + offset, len);
  if (IsPayloadKey(key) && offset + len == entry.size && outbox_.count(key) == 0) {
    inbox_held_ -= entry.size;
    entry.data.reset();
  }
  *st = Status::OK();
  return true;
}

// ------------------------------------------------------------------ the channel

Result<bool> UcxTransport::Wait(uint32_t timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  const bool arrived = cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                                    [&] { return stop_ || arrivals_ != waited_; });
  waited_ = arrivals_;
  return arrived && !stop_;
}

Status UcxTransport::Put(const std::string& key, const uint8_t* data, uint64_t len) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (sender()) {
    std::call_once(awaited_receivers_, [this] { AwaitReceivers(); });
    MsgHeader h;
    h.type = MsgType::kPush;
    h.key = key;
    h.id = TakePushSeq(key);
    {
      std::lock_guard<std::mutex> lk(mu_);
      ledger_.Begin(key);
    }
    if (Status st = spool_->Put(key, data, len); !st.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      ledger_.Failed(key);
      return st;
    }
    auto bytes = std::make_shared<const Buffer>(data, data + len);
    if (options_.k > 0) return PushDown(h, std::move(bytes));
    std::vector<ConnId> conns;
    {
      std::lock_guard<std::mutex> lk(mu_);
      conns = TakePutTargetsLocked(key);
    }
    return PushTo(conns, h, std::move(bytes));
  }
  auto bytes = std::make_shared<const Buffer>(data, data + len);
  StoreInInbox(key, bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    outbox_[key] = bytes;  // until the sender stored it
  }
  Result<std::shared_ptr<Pending>> r = Request(std::nullopt, MsgType::kUpload, key, 0, 0, bytes);
  if (!r.ok()) return Status::OK();  // no sender now: delivered when one connects
  REFIT_RETURN_NOT_OK(r.value()->status);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = outbox_.find(key);
  if (it != outbox_.end() && it->second == bytes) outbox_.erase(it);
  return Status::OK();
}

Result<std::optional<uint64_t>> UcxTransport::Size(const std::string& key) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (sender()) return spool_->Size(key);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = inbox_.find(key);
    if (it != inbox_.end()) return std::optional<uint64_t>(it->second.size);
    auto queued = outbox_.find(key);
    if (queued != outbox_.end() && !queued->second) return std::optional<uint64_t>();
    if (!conn_) {
      // No sender: nothing is newer than an inbox a sender replayed. Before the first connection
      // the inbox knows nothing, and "missing" would tell a receiver restarted mid-apply that its
      // version is gone (it asked for a full sync).
      if (synced_) return std::optional<uint64_t>();
      return NotSynced(key);
    }
  }
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Pending> p,
                        Request(std::nullopt, MsgType::kSize, key, 0, 0, nullptr));
  REFIT_RETURN_NOT_OK(p->status);
  if (p->value == 0) return std::optional<uint64_t>();
  return std::optional<uint64_t>(p->value - 1);
}

Status UcxTransport::Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (sender()) return spool_->Get(key, offset, buf, len);
  Status st;
  if (GetFromInbox(key, offset, buf, len, &st)) return st;
  // Only the sender has it. With none connected (between two `refit send` runs) the next one is
  // waited for: failing at once gave a receiver that re-read a consumed payload three failures in
  // a few milliseconds, and the version was abandoned for a full sync.
  const auto deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  while (true) {
    st = GetThroughSender(key, offset, buf, len);
    if (!IsConnectionError(st) || !WaitForSender(deadline)) return st;
  }
}

// Blocks until a sender is connected (true), the instance stops or deadline passes (false).
bool UcxTransport::WaitForSender(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_ && !conn_) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) break;
  }
  return !stop_ && conn_ && std::chrono::steady_clock::now() < deadline;
}

Status UcxTransport::NotSynced(const std::string& key) const {
  return Status::IoError("ucx transport: not connected to a sender since this receiver started: '" +
                         key + "' is not known yet");
}

// A read of key the inbox could not serve, through the live connection. The answer to a size
// says how many pushes to wait for (it may still be on its way); then the sender's spool.
Status UcxTransport::GetThroughSender(const std::string& key, uint64_t offset, uint8_t* buf,
                                      uint64_t len) {
  Status st;
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Pending> p,
                        Request(std::nullopt, MsgType::kSize, key, 0, 0, nullptr));
  WaitForPushes(p->pushed, p->tree_seq, key);
  if (GetFromInbox(key, offset, buf, len, &st)) return st;
  ++remote_gets_;
  REFIT_ASSIGN_OR_RAISE(p, Request(std::nullopt, MsgType::kGet, key, offset, len, nullptr));
  REFIT_RETURN_NOT_OK(p->status);
  if (p->data.size() != len) {
    return Status::Corrupt("ucx transport: get '" + key + "': the sender sent " +
                           std::to_string(p->data.size()) + " bytes, " + std::to_string(len) +
                           " asked");
  }
  if (len > 0) std::memcpy(buf, p->data.data(), len);
  return Status::OK();
}

Result<std::vector<std::pair<std::string, uint64_t>>> UcxTransport::List(
    const std::string& prefix) {
  REFIT_RETURN_NOT_OK(ValidateTransportPrefix(prefix));
  if (sender()) return spool_->List(prefix);
  Result<std::shared_ptr<Pending>> r = Request(std::nullopt, MsgType::kList, prefix, 0, 0, nullptr);
  std::map<std::string, uint64_t> listed;
  if (r.ok()) {
    REFIT_RETURN_NOT_OK(r.value()->status);
    listed = ParseListing(r.value()->data);
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!r.ok() && !synced_) return NotSynced(prefix);  // an empty inbox is no empty listing
  if (!r.ok()) {
    // No sender: what the inbox holds.
    for (const auto& [key, entry] : inbox_) {
      if (key.compare(0, prefix.size(), prefix) == 0) listed[key] = entry.size;
    }
  }
  for (const auto& [key, data] : outbox_) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    if (data) {
      listed[key] = (*data)->size();
    } else {
      listed.erase(key);
    }
  }
  return std::vector<std::pair<std::string, uint64_t>>(listed.begin(), listed.end());
}

Status UcxTransport::Remove(const std::string& key) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (sender()) {
    REFIT_RETURN_NOT_OK(spool_->Remove(key));
    {
      std::lock_guard<std::mutex> lk(mu_);
      ledger_.Forget(key);
      push_seq_of_.erase(key);
    }
    MsgHeader h;
    h.type = MsgType::kDrop;
    h.key = key;
    return PushTo(ReadyPeers(), h, nullptr);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = inbox_.find(key);
    if (it != inbox_.end()) {
      if (it->second.data) inbox_held_ -= it->second.size;
      inbox_.erase(it);
    }
    outbox_[key] = std::nullopt;
  }
  Result<std::shared_ptr<Pending>> r = Request(std::nullopt, MsgType::kRemove, key, 0, 0, nullptr);
  if (!r.ok()) return Status::OK();  // delivered when a sender connects
  REFIT_RETURN_NOT_OK(r.value()->status);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = outbox_.find(key);
  if (it != outbox_.end() && !it->second) outbox_.erase(it);
  return Status::OK();
}

}  // namespace refit::ucx
