// Value on the wire: what a remote worker call would carry (CAF binary serialization).
#include "test_workers.hpp"

#include <hyflow/actors/caf_inspect.hpp>
#include <hyflow/actors/caf_protocol.hpp>

#include <torch/torch.h>
#include <caf/all.hpp>
#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::actors;

namespace {
Value round_trip(caf::actor_system& sys, Value v) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  if (auto err = sink(v)) throw Error("serialize: " + sys.render(err));
  caf::binary_deserializer source{sys, buf};
  Value out;
  if (auto err = source(out)) throw Error("deserialize: " + sys.render(err));
  return out;
}
}  // namespace

TEST_CASE("a list of DataProto, JSON and none survives CAF binary serialization") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  DataProto batch(TensorDict{{"x", torch::arange(6, torch::kFloat32).reshape({2, 3})}});
  batch.meta_info["step"] = 3;
  Value v(Value::List{Value(batch), Value(Json{{"lr", 0.5}, {"tags", {"a", "b"}}}), Value()});
  Value back = round_trip(sys, v);
  REQUIRE(back.is_list());
  REQUIRE(back.list().size() == 3);
  CHECK(torch::equal(back.list()[0].dataproto().batch.at("x"), batch.batch.at("x")));
  CHECK(back.list()[0].dataproto().meta_info["step"] == 3);
  CHECK(back.list()[1].json()["tags"][1] == "b");
  CHECK(back.list()[2].is_none());
}

TEST_CASE("a future refuses to be serialized, with a message saying so") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  Value f(DataProtoFuture::ready(DataProto()));
  CHECK_THROWS_WITH(round_trip(sys, f), Catch::Contains("cannot be sent to another process"));
}

TEST_CASE("a truncated Value is an error, not a crash") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  Value v(Json{{"k", std::string(100, 'x')}});
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(v));
  buf.resize(buf.size() / 2);
  caf::binary_deserializer source{sys, buf};
  Value out;
  CHECK(static_cast<bool>(source(out)));
}

namespace {
/// A launcher that speaks the worker protocol itself, as the cluster layer's will: spawn,
/// hf_init with spec and environment, wrap the handle.
class ProtocolLauncher : public WorkerLauncher {
 public:
  explicit ProtocolLauncher(Runtime& rt) : rt_(rt) {}
  std::vector<WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) override {
    auto& sys = caf_protocol::system_of(rt_);
    caf::scoped_actor self{sys};
    std::vector<WorkerRef> out;
    for (const auto& env : envs) {
      auto worker = caf_protocol::spawn_worker(sys);
      self->request(worker, std::chrono::seconds(10), caf_protocol::init_atom::value, spec.to_json().dump(),
                    env.to_json().dump())
          .receive([](std::string&) {}, [&](caf::error& e) { throw Error("init failed: " + sys.render(e)); });
      out.push_back(caf_protocol::make_worker_ref(worker, spec, env));
      ++launched;
    }
    return out;
  }
  int launched = 0;

 private:
  Runtime& rt_;
};
}  // namespace

TEST_CASE("a launcher built on the CAF worker protocol places the workers of a group") {
  test::register_test_workers();
  auto rt = std::make_unique<Runtime>();
  auto launcher = std::make_shared<ProtocolLauncher>(*rt);
  rt->set_launcher(launcher);
  {
    WorkerGroup wg(*rt, ResourcePool({3}), WorkerSpec{"EchoWorker", Json::object()});
    CHECK(launcher->launched == 3);
    std::vector<std::string> who = wg.call(&test::EchoWorker::whoami);
    CHECK(who[2] == "rank 2/3");
  }
  rt.reset();
}

namespace {
/// Bytes of `depth` nested one-item lists around a none, written as the Value encoder would.
std::vector<char> nested_lists(caf::actor_system& sys, int depth) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  bool ok = true;
  for (int i = 0; i < depth; ++i) {
    uint8_t tag = 3;
    uint64_t n = 1;
    ok = ok && !sink(tag, n);
  }
  uint8_t none = 0;
  REQUIRE((ok && !sink(none)));
  return buf;
}

std::string decode_error(caf::actor_system& sys, const std::vector<char>& buf) {
  caf::binary_deserializer source{sys, buf};
  Value out;
  auto err = source(out);
  return err ? sys.render(err) : std::string();
}
}  // namespace

TEST_CASE("a Value nested 1,000,000 lists deep is a decode error naming the depth bound, not a stack overflow") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  CHECK(decode_error(sys, nested_lists(sys, 64)).empty());  // at the bound: fine
  CHECK_THAT(decode_error(sys, nested_lists(sys, 65)), Catch::Contains("nested deeper than 64 levels"));
  CHECK_THAT(decode_error(sys, nested_lists(sys, 1000000)), Catch::Contains("nested deeper than 64 levels"));
}

TEST_CASE("a Value list count beyond the bytes in the message is a decode error naming both") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  uint8_t tag = 3;
  uint64_t n = uint64_t{1} << 40;
  REQUIRE_FALSE(sink(tag, n));
  CHECK_THAT(decode_error(sys, buf), Catch::Contains("list of 1099511627776 items, 0 bytes left"));
}

TEST_CASE("a JSON payload nested deeper than 256 levels is a decode error naming its size") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto encode = [&](const std::string& text) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    uint8_t tag = 2;
    std::string copy = text;
    REQUIRE_FALSE(sink(tag, copy));
    return buf;
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THAT(decode_error(sys, encode(deep)), Catch::Contains("JSON payload of 200000 bytes nests deeper than 256"));
  // Brackets inside strings do not count.
  CHECK(decode_error(sys, encode("{\"k\": \"" + std::string(1000, '[') + "\"}")).empty());
}

TEST_CASE("register_types registers no actor type, so CAF's spawn service has nothing to create") {
  caf::actor_system_config cfg;
  caf_protocol::register_types(cfg);
  CHECK(cfg.actor_factories.empty());
  caf::actor_system sys{cfg};
  auto w = sys.spawn<caf_protocol::worker_actor>("hyflow.worker", caf::make_message());
  CHECK_FALSE(w);
}
