// The Sender and Receiver cores behind refit.Sender / refit.Receiver (python/refit/__init__.py
// turns named tensors into entries and stages CUDA tensors through host memory).
//
// Every call into refit runs without the GIL, under the object's own mutex (but a receiver's wait):
// refit's objects are used from one thread at a time, and other Python threads keep running
// meanwhile.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "refit/metrics.h"
#include "refit/receiver.h"
#include "refit/sender.h"
#include "tensors.h"

namespace refit::python {

namespace {

// Runs fn without the GIL, holding mu.
template <typename Fn>
auto Locked(std::mutex& mu, Fn fn) {
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(mu);
  return fn();
}

class SenderCore {
 public:
  SenderCore(const Config& config, int rank, int world) {
    py::gil_scoped_release release;
    sender_ = Unwrap(Sender::Make(config, rank, world), Stage::kConfig);
    metrics_ = Unwrap(SenderMetrics::Make(config, rank, world), Stage::kConfig);
  }

  SyncStats Publish(const py::list& entries) {
    TensorSet tensors = TensorSet::FromEntries(entries, /*writable=*/false);
    Status metrics_written;
    Result<SyncStats> published = Locked(mu_, [&] {
      Result<SyncStats> r = sender_->Publish(tensors.views());
      metrics_written = metrics_->Record(r);
      return r;
    });
    // The version is published: a metrics file that cannot be written is only a warning.
    if (!metrics_written.ok()) {
      const std::string text = "sender.metrics_file not written: " + metrics_written.message();
      if (PyErr_WarnEx(PyExc_RuntimeWarning, text.c_str(), 1) != 0) throw py::error_already_set();
    }
    return Unwrap(std::move(published));
  }

  std::string Metrics() {
    return Locked(mu_, [&] { return metrics_->Text(); });
  }

  void Wait(double timeout_seconds) {
    Check(Locked(mu_, [&] { return sender_->WaitAndAdvance(timeout_seconds); }));
  }

  uint64_t baseline_version() {
    return Locked(mu_, [&] { return sender_->baseline_version(); });
  }
  uint64_t published_version() {
    return Locked(mu_, [&] { return sender_->published_version(); });
  }
  std::vector<Ack> acks() {
    return Locked(mu_, [&] { return sender_->acks(); });
  }

 private:
  std::mutex mu_;
  std::unique_ptr<Sender> sender_;
  std::unique_ptr<SenderMetrics> metrics_;
};

class ReceiverCore {
 public:
  explicit ReceiverCore(const Config& config) {
    py::gil_scoped_release release;
    receiver_ = Unwrap(Receiver::Make(config), Stage::kConfig);
  }

  void Attach(const py::list& entries, std::optional<uint64_t> loaded_version) {
    auto tensors = std::make_unique<TensorSet>(TensorSet::FromEntries(entries, /*writable=*/true));
    Status status =
        Locked(mu_, [&] { return receiver_->Attach(tensors->views(), loaded_version); });
    // The receiver may keep pointers into the new memory even when Attach failed part way, so
    // that memory stays owned too; the previous binding is let go only once Attach succeeded.
    if (status.ok()) attached_.clear();
    attached_.push_back(std::move(tensors));
    Check(status);
  }

  std::optional<ApplyStats> Poll() {
    return Unwrap(Locked(mu_, [&] { return receiver_->PollOnce(); }));
  }

  // Not under mu_: a poll from another thread goes on while this one waits (the transport's
  // wait is safe beside its other calls).
  bool Wait(double timeout_seconds) {
    const double ms = std::clamp(timeout_seconds * 1000, 0.0, double{UINT32_MAX});
    py::gil_scoped_release release;
    return Unwrap(receiver_->WaitForArrival(static_cast<uint32_t>(ms)));
  }

  uint64_t version() {
    return Locked(mu_, [&] { return receiver_->version(); });
  }
  uint64_t applying() {
    return Locked(mu_, [&] { return receiver_->applying(); });
  }
  std::string model_path() {
    return Locked(mu_, [&] { return receiver_->model_path(); });
  }

 private:
  std::mutex mu_;
  std::unique_ptr<Receiver> receiver_;
  std::vector<std::unique_ptr<TensorSet>> attached_;  // the memory the receiver writes into
};

}  // namespace

void BindEndpoints(py::module_& m) {
  py::class_<SenderCore>(m, "_Sender")
      .def(py::init<const Config&, int, int>(), py::arg("config"), py::arg("rank"),
           py::arg("world"))
      .def("publish", &SenderCore::Publish, py::arg("entries"))
      .def("wait", &SenderCore::Wait, py::arg("timeout"))
      .def("metrics", &SenderCore::Metrics)
      .def_property_readonly("baseline_version", &SenderCore::baseline_version)
      .def_property_readonly("published_version", &SenderCore::published_version)
      .def_property_readonly("acks", &SenderCore::acks);
  py::class_<ReceiverCore>(m, "_Receiver")
      .def(py::init<const Config&>(), py::arg("config"))
      .def("attach", &ReceiverCore::Attach, py::arg("entries"), py::arg("loaded_version"))
      .def("poll", &ReceiverCore::Poll)
      .def("wait", &ReceiverCore::Wait, py::arg("timeout"))
      .def_property_readonly("version", &ReceiverCore::version)
      .def_property_readonly("applying", &ReceiverCore::applying)
      .def_property_readonly("model_path", &ReceiverCore::model_path);
}

}  // namespace refit::python
