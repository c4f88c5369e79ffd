// Tracker's out-of-line destructor (the class's key function).
#include <hyflow/tracking/tracker.hpp>

namespace hyflow::tracking {

Tracker::~Tracker() = default;

}  // namespace hyflow::tracking
