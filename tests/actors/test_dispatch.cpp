// Dispatch and collect functions, the method table and resource pools, without actors.
#include "test_workers.hpp"

#include <catch2/catch.hpp>

using namespace hyflow;
using namespace hyflow::actors;
using test::make_batch;

namespace {
/// A stand-in group: world size and mesh infos, counting queries.
class FakeContext : public DispatchContext {
 public:
  explicit FakeContext(int ws) : ws_(ws) {}
  int world_size() const override { return ws_; }
  const std::vector<int64_t>& dispatch_info(const std::string&) override {
    ++dispatch_queries;
    return dp;
  }
  const std::vector<bool>& collect_info(const std::string&) override {
    ++collect_queries;
    return collect;
  }
  std::vector<int64_t> dp;
  std::vector<bool> collect;
  int dispatch_queries = 0, collect_queries = 0;

 private:
  int ws_;
};

std::vector<Value> run_workers(const Dispatched& d, const std::function<Value(int, const std::vector<Value>&)>& f) {
  std::vector<Value> out;
  for (size_t r = 0; r < d.per_rank.size(); ++r) out.push_back(f(static_cast<int>(r), d.per_rank[r]));
  return out;
}
}  // namespace

TEST_CASE("padding_for gives the rows that make a batch divisible") {
  CHECK(dispatch_fns::padding_for(10, 4) == 2);
  CHECK(dispatch_fns::padding_for(8, 4) == 0);
  CHECK(dispatch_fns::padding_for(1, 3) == 2);
  CHECK_THROWS_AS(dispatch_fns::padding_for(5, 0), ValueError);
}

TEST_CASE("DP_COMPUTE_PROTO pads, chunks and the collect un-pads, for world sizes 1-4 and odd batches") {
  auto fns = dispatch_mode(Dispatch::DP_COMPUTE_PROTO);
  CHECK(fns->collects_dataproto);
  for (int ws = 1; ws <= 4; ++ws)
    for (int64_t rows : {1, 5, 7, 10}) {
      CAPTURE(ws, rows);
      FakeContext ctx(ws);
      auto batch = make_batch(rows);
      batch.meta_info[kAutoPaddingKey] = true;
      auto d = fns->dispatch(ctx, {Value(batch)});
      REQUIRE(d.per_rank.size() == static_cast<size_t>(ws));
      const int64_t pad = d.padding->load();
      CHECK(pad == dispatch_fns::padding_for(rows, ws));
      for (auto& a : d.per_rank) CHECK(a[0].dataproto().size() == (rows + pad) / ws);
      auto outputs = run_workers(d, [](int, const std::vector<Value>& a) { return a[0]; });
      auto collected = fns->collect(ctx, outputs).dataproto();
      CHECK(collected.size() == rows + pad);
      auto unpadded = unpad_dataproto(collected, pad);
      CHECK(torch::equal(unpadded.batch.at("x"), batch.batch.at("x")));
    }
}

TEST_CASE("DP_COMPUTE_PROTO without auto-padding rejects a batch that does not split evenly") {
  FakeContext ctx(4);
  auto fns = dispatch_mode(Dispatch::DP_COMPUTE_PROTO);
  CHECK_THROWS_AS(fns->dispatch(ctx, {Value(make_batch(10))}), ShapeError);
  CHECK_NOTHROW(fns->dispatch(ctx, {Value(make_batch(8))}));
}

TEST_CASE("DP_COMPUTE_PROTO with two batches of different sizes names both arguments") {
  FakeContext ctx(2);
  CHECK_THROWS_WITH(dispatch_fns::dp_compute_proto(ctx, {Value(make_batch(4)), Value(make_batch(6))}),
                    Catch::Contains("argument 1 has 6 rows") && Catch::Contains("argument 0 has 4"));
}

TEST_CASE("DP_COMPUTE_PROTO chunks do not copy tensor storage") {
  FakeContext ctx(2);
  auto batch = make_batch(4);
  auto d = dispatch_fns::dp_compute_proto(ctx, {Value(batch)});
  CHECK(d.per_rank[0][0].dataproto().batch.at("x").data_ptr() == batch.batch.at("x").data_ptr());
}

TEST_CASE("DP_COMPUTE_PROTO on a DataProtoFuture pads and chunks when it resolves") {
  FakeContext ctx(4);
  std::promise<DataProto> p;
  DataProtoFuture f({p.get_future().share()});
  auto d = dispatch_fns::dp_compute_proto(ctx, {Value(f)});
  REQUIRE(d.per_rank[3][0].is_dataproto_future());
  auto batch = make_batch(6);
  batch.meta_info[kAutoPaddingKey] = true;
  p.set_value(batch);
  CHECK(d.per_rank[3][0].dataproto_future().get().size() == 2);
  CHECK(d.padding->load() == 2);
}

TEST_CASE("ONE_TO_ALL replicates, ALL_TO_ALL splits per-rank lists and otherwise broadcasts") {
  FakeContext ctx(3);
  auto one = dispatch_fns::one_to_all(ctx, {Value(Json(7))});
  for (auto& a : one.per_rank) CHECK(a[0].json() == 7);
  auto split = dispatch_fns::all_to_all(ctx, {to_value(per_rank(std::vector<int>{1, 2, 3}))});
  CHECK(split.per_rank[2][0].json() == 3);
  auto broadcast = dispatch_fns::all_to_all(ctx, {Value(Json(5)), to_value(per_rank(std::vector<int>{1, 2, 3}))});
  CHECK(broadcast.per_rank[1][0].json() == 5);
  CHECK(broadcast.per_rank[1][1].is_list());
}

TEST_CASE("DP_COMPUTE needs a per-rank list of world-size values") {
  FakeContext ctx(3);
  auto d = dispatch_fns::dp_compute(ctx, {to_value(per_rank(std::vector<int>{4, 5, 6}))});
  CHECK(d.per_rank[1][0].json() == 5);
  CHECK_THROWS_WITH(dispatch_fns::dp_compute(ctx, {to_value(per_rank(std::vector<int>{1, 2}))}),
                    Catch::Contains("list of 3") && Catch::Contains("list[2]"));
  CHECK_THROWS_AS(dispatch_fns::collect_dp_compute(ctx, {Value(Json(1))}), ShapeError);
}

TEST_CASE("DP_COMPUTE_PROTO_WITH_FUNC replicates the function name and chunks without padding") {
  FakeContext ctx(2);
  auto d = dispatch_fns::dp_compute_proto_with_func(ctx, {Value(Json("f")), Value(make_batch(4))});
  CHECK(d.per_rank[1][0].json() == "f");
  CHECK(d.per_rank[1][1].dataproto().size() == 2);
  CHECK_THROWS_AS(dispatch_fns::dp_compute_proto_with_func(ctx, {Value(make_batch(4))}), BindError);
}

TEST_CASE("DP_COMPUTE_METRIC dispatches like DP_COMPUTE_PROTO and collects a raw list") {
  FakeContext ctx(2);
  auto fns = dispatch_mode(Dispatch::DP_COMPUTE_METRIC);
  auto d = fns->dispatch(ctx, {Value(make_batch(4))});
  auto out = fns->collect(ctx, {Value(Json(1)), Value(Json(2))});
  REQUIRE(out.is_list());
  CHECK(out.list()[1].json() == 2);
}

TEST_CASE("DIRECT_ROLLOUT_METHOD dispatch is not supported") {
  FakeContext ctx(2);
  CHECK_THROWS_AS(dispatch_mode(Dispatch::DIRECT_ROLLOUT_METHOD)->dispatch(ctx, {}), NotSupportedError);
}

TEST_CASE("nd-compute dispatch sends chunk dp_rank[r] to rank r and collects flagged ranks in order") {
  FakeContext ctx(4);
  ctx.dp = {0, 0, 1, 1};
  ctx.collect = {true, false, true, false};
  auto fns = make_nd_compute_dataproto_dispatch_fn("actor");
  auto batch = make_batch(4);
  auto d = fns->dispatch(ctx, {Value(batch)});
  CHECK(ctx.dispatch_queries == 1);
  CHECK(ctx.collect_queries == 1);  // warmed during dispatch (non-blocking collects must not query)
  CHECK(torch::equal(d.per_rank[1][0].dataproto().batch.at("x"), d.per_rank[0][0].dataproto().batch.at("x")));
  CHECK(d.per_rank[2][0].dataproto().batch.at("x")[0][0].item<float>() == 6.f);
  auto outputs = run_workers(d, [](int, const std::vector<Value>& a) { return a[0]; });
  auto out = fns->collect(ctx, outputs).dataproto();
  CHECK(torch::equal(out.batch.at("x"), batch.batch.at("x")));
}

TEST_CASE("registered dispatch modes can be used, updated, and not registered twice") {
  const std::string name = "TEST_REVERSED";
  auto reversed = [](DispatchContext& ctx, std::vector<Value> args) {
    Dispatched d;
    for (int r = 0; r < ctx.world_size(); ++r) d.per_rank.push_back({Value(Json(ctx.world_size() - 1 - r))});
    return d;
  };
  register_dispatch_mode(name, reversed, dispatch_fns::collect_list);
  CHECK_THROWS_AS(register_dispatch_mode(name, reversed, dispatch_fns::collect_list), ValueError);
  FakeContext ctx(3);
  CHECK(dispatch_mode(name)->dispatch(ctx, {}).per_rank[0][0].json() == 2);
  update_dispatch_mode(name, reversed, dispatch_fns::collect_rank_zero);
  CHECK(dispatch_mode(name)->collect(ctx, {Value(Json(9)), Value(Json(8))}).json() == 9);
  CHECK_THROWS_AS(update_dispatch_mode("NO_SUCH_MODE", reversed, dispatch_fns::collect_list), KeyError);
  CHECK_THROWS_WITH(dispatch_mode("NO_SUCH_MODE"), Catch::Contains("DP_COMPUTE_PROTO"));
}

TEST_CASE("execute modes ALL and RANK_ZERO pick ranks; user modes register") {
  CHECK(execute_mode(Execute::ALL)->ranks(3) == std::vector<int>{0, 1, 2});
  CHECK(execute_mode(Execute::RANK_ZERO)->ranks(3) == std::vector<int>{0});
  CHECK(execute_mode(Execute::RANK_ZERO)->single_result);
  register_execute_mode("TEST_LAST", {[](int ws) { return std::vector<int>{ws - 1}; }, true});
  CHECK(execute_mode("TEST_LAST")->ranks(4) == std::vector<int>{3});
  CHECK_THROWS_AS(execute_mode("NOPE"), KeyError);
}

TEST_CASE("method table invokes members with converted arguments and names type mismatches") {
  const auto& t = MethodTable<test::EchoWorker>::get();
  test::EchoWorker w(Json::object());
  std::vector<Value> args{Value(Json(5))};
  CHECK(t.at("add_rank", "EchoWorker").invoke(w, args).json() == 5);
  std::vector<Value> bad{Value(Json("five"))};
  CHECK_THROWS_WITH(t.at("add_rank", "EchoWorker").invoke(w, bad),
                    Catch::Contains("argument 0 of 'add_rank'") && Catch::Contains("string"));
  std::vector<Value> none;
  CHECK_THROWS_WITH(t.at("add_rank", "EchoWorker").invoke(w, none), Catch::Contains("takes 1 argument"));
  CHECK_THROWS_WITH(t.at("no_such", "EchoWorker"),
                    Catch::Contains("no method 'no_such'") && Catch::Contains("add_rank"));
  CHECK(t.at("double_x", "EchoWorker").options.dispatch == std::string(Dispatch::DP_COMPUTE_PROTO));
  CHECK(t.at("double_x", "EchoWorker").returns_dataproto);
  CHECK(t.at("noop", "EchoWorker").options.blocking);             // verl's defaults
  CHECK(t.at("noop", "EchoWorker").options.materialize_futures);
  CHECK(t.at("noop", "EchoWorker").options.execute == std::string(Execute::ALL));
  CHECK(t.find("query_dispatch_info") != nullptr);  // built-ins
}

TEST_CASE("worker meshes: register once, query, unknown mesh names itself") {
  test::EchoWorker w(Json::object());
  w.register_dispatch_collect_info("actor", 3, true);
  CHECK(w.query_dispatch_info("actor") == 3);
  CHECK(w.query_collect_info("actor"));
  CHECK_THROWS_AS(w.register_dispatch_collect_info("actor", 1, false), ValueError);
  CHECK_THROWS_WITH(w.query_dispatch_info("ref"), Catch::Contains("'ref'"));
}

TEST_CASE("resource pool: world size, local ranks and deterministic placement") {
  ResourcePool pool({2, 3});
  CHECK(pool.world_size() == 5);
  CHECK(pool.local_rank_list() == std::vector<int>{0, 1, 0, 1, 2});
  CHECK(pool.local_world_size_list() == std::vector<int>{2, 2, 3, 3, 3});
  auto envs = pool.place("p_", "Echo", "127.0.0.1", 1234);
  CHECK(envs[3].name == "p_Echo_1:1");
  CHECK(envs[3].rank == 3);
  CHECK(envs[3].local_rank == 1);
  CHECK(envs[3].master_port == 1234);
  pool.add_node(1);
  CHECK(pool.world_size() == 6);
  CHECK_THROWS_AS(ResourcePool({2, 0}), ValueError);
  CHECK_THROWS_WITH(ResourcePool({9}, 10, 8, true), Catch::Contains("n_gpus_per_node=8"));
}

TEST_CASE("resource pool manager maps roles and checks resources with a clear error") {
  ResourcePoolManager m({{"global_pool", {4, 4}}, {"reward_pool", {2}}},
                        {{"actor_rollout", "global_pool"}, {"critic", "global_pool"}, {"rm", "reward_pool"}});
  CHECK(m.get_n_gpus() == 10);
  CHECK_NOTHROW(m.check_resources({6, 4}));
  CHECK_THROWS_WITH(m.check_resources({4, 4}), Catch::Contains("need 10") && Catch::Contains("offer 8"));
  CHECK_THROWS_WITH(m.check_resources({8, 1, 1}), Catch::Contains("pool 'global_pool'"));
  CHECK_THROWS_AS(m.get_resource_pool("critic"), KeyError);  // not created yet
  m.create_resource_pools();
  CHECK(m.get_resource_pool("critic").world_size() == 8);
  CHECK(&m.get_resource_pool("critic") == &m.get_resource_pool("actor_rollout"));
  CHECK_THROWS_WITH(m.get_resource_pool("ref"), Catch::Contains("'ref'"));
  CHECK_THROWS_AS(ResourcePoolManager({{"a", {1}}}, {{"critic", "b"}}), KeyError);
}

TEST_CASE("Value conversions: JSON scalars, vectors, DataProto, futures and errors") {
  CHECK(from_value<int>(to_value(3), "x") == 3);
  CHECK(from_value<std::vector<int>>(to_value(std::vector<int>{1, 2}), "x") == std::vector<int>{1, 2});
  CHECK(from_value<std::vector<int>>(to_value(per_rank(std::vector<int>{1, 2})), "x") == std::vector<int>{1, 2});
  CHECK_THROWS_WITH(from_value<DataProto>(to_value(3), "argument 0 of 'f'"),
                    Catch::Contains("argument 0 of 'f'") && Catch::Contains("DataProto"));
  auto b = make_batch(2);
  CHECK(from_value<DataProto>(Value(DataProtoFuture::ready(b)), "x").size() == 2);
  CHECK(from_value<DataProtoFuture>(Value(b), "x").get().size() == 2);
  CHECK(Value().kind() == "none");
}
