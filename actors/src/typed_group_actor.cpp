// Typed group actors: the spawn-time check of an interface against a group's method table, and
// the call bookkeeping shared by every interface (typed_group_actor.hpp).
#include <hyflow/actors/dispatch.hpp>
#include <hyflow/actors/typed_group_actor.hpp>

#include <cstring>

namespace hyflow::actors::detail {

namespace {
std::string signature_of(const std::string& name, const std::vector<std::string>& params, const std::string& result) {
  std::string s = name + "(";
  for (size_t i = 0; i < params.size(); ++i) s += (i ? ", " : "") + params[i];
  return s + ") -> " + result;
}

enum class Produced { one, per_rank, unknown };

bool is_list_mode(const std::string& dispatch) {
  return dispatch == Dispatch::ONE_TO_ALL || dispatch == Dispatch::ALL_TO_ALL || dispatch == Dispatch::DP_COMPUTE ||
         dispatch == Dispatch::DP_COMPUTE_METRIC;
}
}  // namespace

void check_interface(const WorkerGroup& group, const std::vector<InterfaceMethod>& methods) {
  const MethodTableBase& table = group.methods();
  for (const auto& m : methods) {
    const std::string where = "typed group actor of worker type '" + group.worker_type() + "': method '" + m.name + "'";
    const MethodEntry* e = table.find(m.name);
    if (!e) {
      std::string known;
      for (const auto& [name, entry] : table.entries()) known += (known.empty() ? "" : ", ") + name;
      throw BindError(where + " is not in the group's method table (its methods: " + known + ")");
    }
    const std::string registered = signature_of(e->name, e->parameter_types, e->result_type);
    const std::string declared = signature_of(m.name, m.parameter_types, m.result_type);
    if (m.pointer_type) {
      if (e->pointer_type != *m.pointer_type)
        throw BindError(where + " is registered as " + registered + ", the interface declares " + declared +
                        (registered == declared ? " (with other C++ types, or as a member of another class)" : ""));
      if (std::memcmp(e->pointer_bytes.data(), m.pointer_bytes.data(), m.pointer_bytes.size()) != 0)
        throw BindError(where + " is registered for another member function of the same signature " + registered);
    } else if (e->parameter_types != m.parameter_types || e->result_type != m.result_type) {
      throw BindError(where + " is registered as " + registered + ", the interface declares " + declared);
    }

    const MethodOptions& o = e->options;
    if (!o.inline_dispatch && o.dispatch == Dispatch::DIRECT_ROLLOUT_METHOD)
      throw BindError(where + " is a DIRECT_ROLLOUT_METHOD: it cannot be called through a group");
    if (m.shape == ResultShape::any || m.shape == ResultShape::none) continue;
    auto fns = o.inline_dispatch ? o.inline_dispatch : dispatch_mode(o.dispatch);
    auto exec = execute_mode(o.execute);
    Produced produced = Produced::unknown;
    if (exec->single_result || (!o.inline_dispatch && o.dispatch == Dispatch::RANK_ZERO) || fns->collects_dataproto)
      produced = Produced::one;
    else if (!o.inline_dispatch && is_list_mode(o.dispatch))
      produced = Produced::per_rank;
    const std::string modes =
        " (dispatch " + (o.inline_dispatch ? std::string("inline") : o.dispatch) + ", execute " + o.execute + ")";
    if (produced == Produced::one && m.shape == ResultShape::per_rank)
      throw BindError(where + modes + " answers one " + e->result_type + ", the interface declares " +
                      m.declared_result + " (declare " + e->result_type + " or Value)");
    if (produced == Produced::per_rank && m.shape == ResultShape::one)
      throw BindError(where + modes + " answers one " + e->result_type + " per rank, the interface declares " +
                      m.declared_result + " (declare std::vector of it, or Value)");
  }
}

caf::response_promise start_typed_call(typed_group_self* self, const std::string& method, std::vector<Value> args,
                                       std::function<void(caf::response_promise&, Value)> deliver) {
  auto& st = self->state;
  auto promise = self->make_response_promise();
  const uint64_t id = st.next_id++;
  auto me = caf::actor_cast<caf::actor>(self);  // alive until the answer is in
  try {
    st.group->call_then(
        method, std::move(args), [me, id](Value v) { caf::anon_send(me, typed_done_atom::value, id, std::move(v)); },
        [me, id](std::exception_ptr e) { caf::anon_send(me, typed_done_atom::value, id, to_caf_error(e)); });
  } catch (...) {
    promise.deliver(to_caf_error(std::current_exception()));
    return promise;
  }
  st.pending.emplace(id, typed_group_state::Pending{promise, std::move(deliver)});
  return promise;
}

void finish_typed_call(typed_group_self* self, uint64_t id, Value* value, caf::error* error) {
  auto it = self->state.pending.find(id);
  if (it == self->state.pending.end()) return;
  auto pending = std::move(it->second);
  self->state.pending.erase(it);
  if (error)
    pending.promise.deliver(std::move(*error));
  else
    pending.deliver(pending.promise, std::move(*value));
}

}  // namespace hyflow::actors::detail
