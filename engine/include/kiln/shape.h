// Shape: the dimensions (or strides) of a tensor, with room for a few of them inline.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace kiln {

// A vector of int64_t that keeps up to kInline elements inside the object and moves to the
// heap only beyond that. Every tensor handle holds two (shape and strides) and the executor
// makes a handle per node output, so with std::vector each run paid two heap allocations per
// node for a handful of numbers. It offers the std::vector interface the code uses and
// converts to and from std::vector<int64_t> (those conversions copy, and allocate).
class Shape {
 public:
  static constexpr size_t kInline = 6;

  using value_type = int64_t;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = int64_t&;
  using const_reference = const int64_t&;
  using pointer = int64_t*;
  using const_pointer = const int64_t*;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  Shape() noexcept = default;
  explicit Shape(size_t n) { assign(n, 0); }
  Shape(size_t n, int64_t value) { assign(n, value); }
  Shape(std::initializer_list<int64_t> values) { assign(values.begin(), values.end()); }
  template <std::input_iterator It>
  Shape(It first, It last) {
    assign(first, last);
  }
  // Implicit both ways, so code written for std::vector<int64_t> keeps working.
  Shape(const std::vector<int64_t>& values) { assign(values.begin(), values.end()); }     // NOLINT
  operator std::vector<int64_t>() const { return std::vector<int64_t>(begin(), end()); }  // NOLINT

  Shape(const Shape& other) { assign(other.begin(), other.end()); }
  Shape(Shape&& other) noexcept { take(other); }
  Shape& operator=(const Shape& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  Shape& operator=(std::initializer_list<int64_t> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  ~Shape() { release(); }

  iterator begin() noexcept { return data_; }
  iterator end() noexcept { return data_ + size_; }
  const_iterator begin() const noexcept { return data_; }
  const_iterator end() const noexcept { return data_ + size_; }
  const_iterator cbegin() const noexcept { return begin(); }
  const_iterator cend() const noexcept { return end(); }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }

  size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_t capacity() const noexcept { return capacity_; }
  int64_t* data() noexcept { return data_; }
  const int64_t* data() const noexcept { return data_; }
  int64_t& operator[](size_t i) noexcept { return data_[i]; }
  const int64_t& operator[](size_t i) const noexcept { return data_[i]; }
  int64_t& at(size_t i) {
    check_index(i);
    return data_[i];
  }
  const int64_t& at(size_t i) const {
    check_index(i);
    return data_[i];
  }
  int64_t& front() noexcept { return data_[0]; }
  const int64_t& front() const noexcept { return data_[0]; }
  int64_t& back() noexcept { return data_[size_ - 1]; }
  const int64_t& back() const noexcept { return data_[size_ - 1]; }

  void reserve(size_t n) {
    if (n > capacity_) grow_to(n);
  }
  void clear() noexcept { size_ = 0; }
  void push_back(int64_t value) {
    if (size_ == capacity_) grow_to(capacity_ * 2);
    data_[size_++] = value;
  }
  int64_t& emplace_back(int64_t value) {
    push_back(value);
    return back();
  }
  void pop_back() noexcept { --size_; }
  void resize(size_t n, int64_t value = 0) {
    reserve(n);
    if (n > size_) std::fill(data_ + size_, data_ + n, value);
    size_ = n;
  }
  void assign(size_t n, int64_t value) {
    clear();
    resize(n, value);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    clear();
    if constexpr (std::forward_iterator<It>)
      reserve(static_cast<size_t>(std::distance(first, last)));
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }
  void assign(std::initializer_list<int64_t> values) { assign(values.begin(), values.end()); }

  iterator insert(const_iterator pos, int64_t value) { return insert(pos, size_t{1}, value); }
  iterator insert(const_iterator pos, size_t n, int64_t value) {
    const size_t at = open_gap(pos, n);
    std::fill(data_ + at, data_ + at + n, value);
    return data_ + at;
  }
  template <std::forward_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    // Copy first: the range may lie inside this shape, and growing would move it.
    const Shape values(first, last);
    const size_t at = open_gap(pos, values.size());
    std::copy(values.begin(), values.end(), data_ + at);
    return data_ + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<int64_t> values) {
    return insert(pos, values.begin(), values.end());
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    int64_t* f = data_ + (first - data_);
    std::copy(last, cend(), f);
    size_ -= static_cast<size_t>(last - first);
    return f;
  }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend std::strong_ordering operator<=>(const Shape& a, const Shape& b) noexcept {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void check_index(size_t i) const {
    if (i >= size_) throw std::out_of_range("kiln::Shape::at: index out of range");
  }
  bool on_heap() const noexcept { return data_ != inline_; }
  void release() noexcept {
    if (on_heap()) delete[] data_;
    data_ = inline_;
    size_ = 0;
    capacity_ = kInline;
  }
  // Leaves `other` empty and inline.
  void take(Shape& other) noexcept {
    if (other.on_heap()) {
      data_ = other.data_;
      capacity_ = other.capacity_;
    } else {
      std::copy(other.begin(), other.end(), inline_);
    }
    size_ = other.size_;
    other.data_ = other.inline_;
    other.size_ = 0;
    other.capacity_ = kInline;
  }
  void grow_to(size_t n) {
    n = std::max(n, kInline * 2);
    int64_t* bigger = new int64_t[n];
    std::copy(begin(), end(), bigger);
    if (on_heap()) delete[] data_;
    data_ = bigger;
    capacity_ = n;
  }
  // Moves the elements from `pos` on n places right and returns the index of the gap.
  size_t open_gap(const_iterator pos, size_t n) {
    const auto at = static_cast<size_t>(pos - data_);
    if (size_ + n > capacity_) grow_to(std::max(size_ + n, capacity_ * 2));
    std::copy_backward(data_ + at, data_ + size_, data_ + size_ + n);
    size_ += n;
    return at;
  }

  int64_t* data_ = inline_;
  size_t size_ = 0;
  size_t capacity_ = kInline;
  int64_t inline_[kInline] = {};
};

}  // namespace kiln
